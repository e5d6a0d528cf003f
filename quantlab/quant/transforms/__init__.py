"""Transforms applied to a linear before its weight format rounds it (a recipe's ``transforms:`` on any weight
format): each changes the weight and what the layer does to its input so that the unrounded model computes the
same function, and the rounding then meets a better-conditioned weight. Registered in ``TRANSFORMS``; importing
this package registers the built-in ones."""
from . import hadamard, rotate_residual, smoothquant  # noqa: F401  (registration)
from .base import TRANSFORMS, Transform, apply_transforms_

__all__ = ["TRANSFORMS", "Transform", "apply_transforms_"]
