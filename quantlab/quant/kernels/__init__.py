"""Matmul paths for quantized weights, one module per family. Importing this package registers every built-in
one; ``kernel: auto`` tries them in the order of their declared ``preference``."""
from . import bitplane, fp8, ggml, gptqmodel, lut4, torch_int  # noqa: F401  (registration)
from .base import KERNELS, Kernel, choose_kernel

__all__ = ["KERNELS", "Kernel", "choose_kernel"]
