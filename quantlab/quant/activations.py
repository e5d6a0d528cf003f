"""Rounding the activations that enter a quantized linear (``activations:`` on a weight format): W4A4 NVFP4 or
MXFP4, W8A8 MXFP8 and FP8, as vLLM runs them on tensor cores, emulated here (the input rounded to the format's grid
and back, then the weight's product), so the figures measure the numerics, not the speed of FP4 / FP8 units.

The scales are dynamic, from the activation being rounded, as the references' schemes take them: MX blocks of 32
along the features with e8m0 scales (compressed-tensors' MXFP4 / MXFP8 input_activations); NVFP4 blocks of 16 with
e4m3 scales under a float32 global scale from the tensor's own maximum (compressed-tensors calibrates that global
scale once, on calibration data; here each call takes its own, the figure that calibration approaches); FP8 e4m3
with a scale per token (vLLM's dynamic per-token) or per group of 128 features (FP8_BLOCK's input_activations).
"""
from __future__ import annotations

from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

Rounding = Callable[..., torch.Tensor]  # float32 rows [tokens, features] (, scale rounding) -> the same, rounded
ROUNDINGS: dict[str, tuple[Rounding, int]] = {}  # name -> (rounding, the feature count it takes blocks of)


def register_rounding(name: str, rounding: Rounding, block: int) -> None:
    """Make ``activations: {format: name}`` round inputs with ``rounding`` (a stored form's folder registers its
    own; fp8 is here)."""
    ROUNDINGS[name] = (rounding, block)


class ActivationFormat(BaseModel):
    """How a quantized linear rounds its input."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: str = Field(description="nvfp4 | mxfp4 | mxfp8 (dynamic block scales) | fp8 (e4m3)")
    group_size: int | None = Field(None, gt=0, description="fp8 only: one scale per this many features "
                                   "(128: FP8_BLOCK's); null: one per token")
    scale_rounding: Literal["floor", "round", "even", "ceil", "rceil"] | None = Field(
        None, description="mxfp4 / mxfp8 only: how a block's e8m0 scale is taken (the weight formats' field); null: "
        "floor (OCP MX, torchao); round is compressed-tensors' forward, which a compressed-tensors export needs")

    @model_validator(mode="before")
    @classmethod
    def _name(cls, data: object) -> object:
        return {"format": data} if isinstance(data, str) else data

    @field_validator("format")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in ROUNDINGS:
            raise ValueError(f"unknown activation format '{name}'; known: {', '.join(sorted(ROUNDINGS))}")
        return name

    @model_validator(mode="after")
    def _groups(self) -> "ActivationFormat":
        if self.group_size is not None and self.format != "fp8":
            raise ValueError(f"group_size is fp8's; {self.format} has blocks of its own")
        if self.scale_rounding is not None and not self.format.startswith("mx"):
            raise ValueError(f"scale_rounding is for mxfp4 and mxfp8; {self.format} has no e8m0 scales")
        return self

    @property
    def label(self) -> str:
        return ("a" + self.format + (f"-g{self.group_size}" if self.group_size else "")
                + (f"-{self.scale_rounding}" if self.scale_rounding not in (None, "floor") else ""))

    @property
    def block(self) -> int:
        """The feature count the input must be a multiple of."""
        return self.group_size if self.format == "fp8" and self.group_size else ROUNDINGS[self.format][1]

    def module(self) -> "ActivationRounding":
        return ActivationRounding(self.format, self.group_size, self.scale_rounding)


def rounding_module(fmt: ActivationFormat | None) -> "ActivationRounding | None":
    """The input rounding of a format's ``activations`` field, or None (weight-only)."""
    return None if fmt is None else fmt.module()


def round_activations(x: torch.Tensor, fmt: str, group_size: int | None = None,
                      scale_rounding: str | None = None) -> torch.Tensor:
    """``x [..., features]`` rounded to ``fmt``'s grid with dynamic scales and returned in ``x``'s dtype."""
    shape, dtype = x.shape, x.dtype
    rows = x.reshape(-1, shape[-1]).float()
    if fmt == "fp8":
        out = fp8_rows(rows, group_size)
    else:
        out = ROUNDINGS[fmt][0](rows, scale_rounding) if scale_rounding else ROUNDINGS[fmt][0](rows)
    return out.reshape(shape).to(dtype)


def fp8_rows(rows: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """e4m3 with a scale per row (token) or per ``group_size`` features: the maximum over 448, as ``quantize_fp8``
    rounds a weight row, without its finiteness check (a host sync on every input, and a break in a compiled
    graph)."""
    groups = rows.reshape(rows.shape[0], -1, group_size or rows.shape[1])
    amax = groups.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return ((groups / scale).to(torch.float8_e4m3fn).float() * scale).reshape(rows.shape)


register_rounding("fp8", fp8_rows, 1)


class ActivationRounding(nn.Module):
    """The input rounding a quantized linear applies before its product (no stored tensors)."""

    def __init__(self, fmt: str, group_size: int | None = None, scale_rounding: str | None = None) -> None:
        super().__init__()
        self.fmt, self.group_size, self.scale_rounding = fmt, group_size, scale_rounding

    @property
    def spec(self) -> ActivationFormat:
        """The ``activations:`` entry this module rounds by."""
        return ActivationFormat(format=self.fmt, group_size=self.group_size,
                                scale_rounding=getattr(self, "scale_rounding", None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return round_activations(x, self.fmt, self.group_size, getattr(self, "scale_rounding", None))

    def extra_repr(self) -> str:
        return self.spec.label[1:]
