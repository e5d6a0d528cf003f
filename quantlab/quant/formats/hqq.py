"""HQQ as a weight format: round-to-nearest with float zero points (``float_zero.py``), the zero points then
refined by HQQ's half-quadratic solve; calibration free."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from ..format import WEIGHT_FORMATS
from .rtn import RTNFormat


@WEIGHT_FORMATS.register("hqq", "HQQ: float zero points solved by half-quadratic optimization, no calibration; "
                         "fields: bits, group_size, scale_dtype, compute_dtype, kernel")
class HQQFormat(RTNFormat):
    """Integer codes with a float zero point per group, the zero points refined by HQQ's proximal solver."""

    bits: int = Field(4, ge=2, le=8, description="code width (default 4, as HQQ's BaseQuantizeConfig)")
    group_size: int | None = Field(default=64, gt=0, description="input columns per scale; null = per output channel")
    zero_point: Literal["int", "float"] = Field("float", description="always float: the zero points HQQ solves")
    round_zero: bool | None = Field(None, description="start the solve from zero points rounded to codes; default as "
                                    "HQQLinear's BaseQuantizeConfig sets it (true at 4 bits, false otherwise)")
    solves_zero_points: ClassVar[bool] = True
    example_fields: ClassVar[dict[str, Any] | None] = {"bits": 4, "group_size": 64}

    @property
    def rounds_zero_points(self) -> bool:
        return bool(self.round_zero)

    @model_validator(mode="after")
    def _round_zero_as_hqqlinear(self) -> "HQQFormat":
        """The library's default resolved into the config, so a record says which was measured."""
        if self.round_zero is None:
            object.__setattr__(self, "round_zero", self.bits == 4)
        return self

    @model_validator(mode="after")
    def _hqq_fields(self) -> "HQQFormat":
        if self.symmetric or self.per_tensor or self.clip != "none" or self.zero_point != "float":
            raise ValueError("hqq solves a float zero point per group: symmetric, per_tensor, clip and zero_point "
                             "do not apply")
        return self

    @property
    def scheme_label(self) -> str:
        parts = [f"hqq{self.bits}", "pc" if self.group_size is None else f"g{self.group_size}"]
        if self.round_zero != (self.bits == 4):  # not HQQLinear's default for these bits
            parts.append("rz" if self.round_zero else "norz")
        parts += self.compute_dtype_label()
        return "-".join(parts + ([self.kernel] if self.kernel != "auto" else []))
