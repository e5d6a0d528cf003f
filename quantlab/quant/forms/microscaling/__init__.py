"""Microscaling stored forms (OCP MXFP4 / MXFP8, NVFP4): the layout (``tensor``), the rounding into it
(``quantize``) and the recipe formats that fill it (``format``)."""
from . import activations, codecs, format, kernel  # noqa: F401  (registration)
from .quantize import quantize_mx, quantize_nvfp4
from .tensor import MXTensor, NVFP4Tensor

__all__ = ["MXTensor", "NVFP4Tensor", "quantize_mx", "quantize_nvfp4"]
