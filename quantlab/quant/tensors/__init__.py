"""What every stored weight form shares: the ``WeightTensor`` interface (``base``) and the pure tensor functions
behind the forms (``primitives``: affine rounding, sub-byte packing). The forms themselves live in
``quant/forms/<form>/``."""
from .base import WeightTensor

__all__ = ["WeightTensor"]
