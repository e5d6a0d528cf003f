"""4-bit codes into a 16-value codebook (NF4, FP4, quanto/bitsandbytes' maps) with an absmax per block
(``tensor``), read through a lookup table in C (``kernel``). No export target holds a codebook."""
from . import kernel  # noqa: F401  (registration)
from .tensor import CodebookTensor, quantize_codebook

__all__ = ["CodebookTensor", "quantize_codebook"]
