"""How stored weight forms are written to export targets.

A ``Codec`` writes one stored form (``WeightTensor.form``) to one target; codecs are registered by (target, form)
from each form's folder (``quant/forms/<form>/codecs.py``). Exporters find a module's codec by its stored form and
never name a form; a weight format's ``exports`` are the targets whose codecs claim every form it stores
(``targets_holding``), so what a format promises is what its forms' codecs write. The per-target codec interfaces
are here (``compressed_tensors``, ``gguf``, ``integer``) beside the export targets' own interface (``targets``).
"""
from .base import CODECS, Codec, codec_for, codecs_of, register_codec, targets_holding
from .targets import EXPORTERS, Exporter, ExportResult, LinearWeight, per_module_targets

__all__ = ["CODECS", "EXPORTERS", "Codec", "ExportResult", "Exporter", "LinearWeight", "codec_for", "codecs_of",
           "per_module_targets", "register_codec", "targets_holding"]
