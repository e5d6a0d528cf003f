"""Checkpoints in and out: the common GPTQ layout (qweight / qzeros / scales / g_idx), and exporters (``export_``)
to other ecosystems' formats, one module each."""
from . import awq, compressed_tensors, gguf  # noqa: F401  (register their exporters)
from .export import EXPORTERS, ExportResult, export_
from .gptq import load_gptq, save_gptq

__all__ = ["EXPORTERS", "ExportResult", "export_", "load_gptq", "save_gptq"]
