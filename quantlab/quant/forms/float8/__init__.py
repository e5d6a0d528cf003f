"""float8 values (e4m3, e5m2) with a float32 scale per tensor, channel or square block (``tensor``), multiplied in
C after widening in registers (``kernel``); ``codecs``: compressed-tensors' float-quantized weights."""
from . import codecs, kernel  # noqa: F401  (registration)
from .tensor import Float8Tensor, quantize_fp8

__all__ = ["Float8Tensor", "quantize_fp8"]
