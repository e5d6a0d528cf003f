"""KV-cache formats. Importing this package registers every built-in format."""
from . import ggml, hf_quantized, microscaling, native, per_layer, quantized, split  # noqa: F401  (registration)
from .format import KV_FORMATS, KVFormat

__all__ = ["KV_FORMATS", "KVFormat"]
