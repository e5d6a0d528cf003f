"""Checkpoints in and out: the common GPTQ layout (qweight / qzeros / scales / g_idx)."""
from .gptq import load_gptq, save_gptq

__all__ = ["load_gptq", "save_gptq"]
