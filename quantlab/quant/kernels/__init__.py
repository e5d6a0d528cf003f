"""The kernel interface and registry: a matmul path for a stored form, ``auto`` trying them in the order of their
declared ``preference``. Each stored form's kernels live in its folder (``quant/forms/<form>/``) and register
there."""
from .base import KERNELS, Kernel, choose_kernel

__all__ = ["KERNELS", "Kernel", "choose_kernel"]
