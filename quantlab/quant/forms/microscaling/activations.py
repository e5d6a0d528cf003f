"""The microscaling forms as activation roundings (``activations: nvfp4 | mxfp4 | mxfp8``): each token's features
rounded as a weight row is, with dynamic scales (NVFP4's global scale from the tensor's own maximum, or a static
one calibrated per linear: ``global_scale: static``)."""
from __future__ import annotations

from ...activations import register_rounding, static_global_scale
from .quantize import quantize_mx, quantize_nvfp4
from .tensor import MX_BLOCK, NVFP4_BLOCK

register_rounding("nvfp4", lambda rows, global_scale=None: quantize_nvfp4(rows, global_scale).dequantize(), NVFP4_BLOCK,
                  static_scale=static_global_scale)
register_rounding("mxfp4", lambda rows, rule="floor": quantize_mx(rows, "e2m1", rule).dequantize(), MX_BLOCK)
register_rounding("mxfp8", lambda rows, rule="floor": quantize_mx(rows, "e4m3", rule).dequantize(), MX_BLOCK)
