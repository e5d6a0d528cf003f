"""HQQ as a weight format: float zero points solved by half-quadratic optimization (``float_zero.py``)."""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from .float_zero import FloatZeroTensor, quantize_float_zero
from .format import DTYPES, SHORT_DTYPE, WEIGHT_FORMATS
from .linear import QuantizedLinear, linear_weight
from .rtn import AffineFormat


@WEIGHT_FORMATS.register("hqq", "HQQ: float zero points solved by half-quadratic optimization, no calibration; "
                         "fields: bits, group_size, scale_dtype, compute_dtype, kernel")
class HQQFormat(AffineFormat):
    """Integer codes with a float zero point per group, the zero points refined by HQQ's proximal solver."""

    group_size: int | None = Field(default=64, gt=0, description="input columns per scale; null = per output channel")
    zero_point: Literal["int", "float"] = Field("float", description="always float: the zero points HQQ solves")

    @model_validator(mode="after")
    def _hqq_fields(self) -> "HQQFormat":
        if self.symmetric or self.per_tensor or self.clip != "none" or self.zero_point != "float":
            raise ValueError("hqq solves a float zero point per group: symmetric, per_tensor, clip and zero_point "
                             "do not apply")
        return self

    @property
    def label(self) -> str:
        parts = [f"hqq{self.bits}", "pc" if self.group_size is None else f"g{self.group_size}"]
        parts += [SHORT_DTYPE[self.compute_dtype]] if self.compute_dtype else []
        return "-".join(parts + ([self.kernel] if self.kernel != "auto" else []))

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return FloatZeroTensor.analytic_nbytes((out_features, in_features), self.bits, self.group_size,
                                               DTYPES[self.scale_dtype].itemsize)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        q = quantize_float_zero(linear_weight(module), self.bits, self.group_size, True, DTYPES[self.scale_dtype])
        return QuantizedLinear.from_linear(module, q, self.kernels, {"method": "hqq"})
