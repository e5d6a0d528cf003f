"""Stored weight forms (dataclasses of tensors with their byte counts) and the pure tensor functions
behind them: affine quantization, sub-byte packing, float zero points, codebooks, float8."""
from .affine import QuantizedTensor, quantize_tensor
from .base import WeightTensor
from .codebook import CodebookTensor, quantize_codebook
from .float8 import Float8Tensor, quantize_fp8
from .float_zero import FloatZeroTensor, quantize_float_zero

__all__ = ["CodebookTensor", "Float8Tensor", "FloatZeroTensor", "QuantizedTensor", "WeightTensor",
           "quantize_codebook", "quantize_float_zero", "quantize_fp8", "quantize_tensor"]
