"""Rounding the activations that enter a quantized linear (``activations:`` on a weight format): W4A4 NVFP4 or
MXFP4, W8A8 MXFP8 and FP8, as vLLM runs them on tensor cores, emulated here (the input rounded to the format's grid
and back, then the weight's product), so the figures measure the numerics, not the speed of FP4 / FP8 units.

The scales are dynamic, from the activation being rounded, as the references' schemes take them: MX blocks of 32
along the features with e8m0 scales (compressed-tensors' MXFP4 / MXFP8 input_activations); NVFP4 blocks of 16 with
e4m3 scales under a float32 global scale, by default from the tensor's own maximum at each call, or with
``global_scale: static`` one per linear calibrated on the calibration text as compressed-tensors' NVFP4 preset has
it (its ``static_minmax`` observer: ``448 · 6 / max|x|`` over every calibration input, the rounding active while it
observes, as llm-compressor calibrates), the ``input_global_scale`` a compressed-tensors export holds; FP8 e4m3
with a scale per token (vLLM's dynamic per-token) or per group of 128 features (FP8_BLOCK's input_activations);
int8 symmetric per token (W8A8 and W4A8 integer schemes, vLLM's dynamic per-token int8) or, with ``global_scale:
static``, one calibrated scale per linear. A kernel may fuse the rounding into an integer product
(``Kernel.rounded_matmul``: the affine form's ``int8_act_cpu``); elsewhere it is emulated.
"""
from __future__ import annotations

from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

Rounding = Callable[..., torch.Tensor]  # float32 rows [tokens, features] (, scale rounding) -> the same, rounded
StaticScale = Callable[[torch.Tensor], torch.Tensor]  # the calibrated max |x| [1] -> the scale the rounding takes
ROUNDINGS: dict[str, tuple[Rounding, int]] = {}  # name -> (rounding, the feature count it takes blocks of)
STATIC_SCALES: dict[str, StaticScale] = {}  # formats that take ``global_scale: static``, and how


def register_rounding(name: str, rounding: Rounding, block: int, static_scale: StaticScale | None = None) -> None:
    """Make ``activations: {format: name}`` round inputs with ``rounding`` (a stored form's folder registers its
    own; fp8 is here); ``static_scale``: the format also takes one scale per linear calibrated on data
    (``global_scale: static``), computed from the largest ``|x|`` observed and passed to ``rounding`` as
    ``global_scale``."""
    ROUNDINGS[name] = (rounding, block)
    if static_scale is not None:
        STATIC_SCALES[name] = static_scale


class ActivationFormat(BaseModel):
    """How a quantized linear rounds its input."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: str = Field(description="nvfp4 | mxfp4 | mxfp8 (dynamic block scales) | fp8 (e4m3) | int8 (symmetric, "
                        "per token or static per tensor)")
    group_size: int | None = Field(None, gt=0, description="fp8 only: one scale per this many features "
                                   "(128: FP8_BLOCK's); null: one per token")
    scale_rounding: Literal["floor", "round", "even", "ceil", "rceil"] | None = Field(
        None, description="mxfp4 / mxfp8 only: how a block's e8m0 scale is taken (the weight formats' field); null: "
        "floor (OCP MX, torchao); round is compressed-tensors' forward, which a compressed-tensors export needs")
    scale_divisor: Literal[127.0, 127.5] | None = Field(
        None, description="int8 only: a token's scale is its max |x| over this: 127 (null; vLLM's int8 kernels, "
        "which run compressed-tensors' W8A8 checkpoints) or 127.5 (compressed-tensors' own forward, which "
        "transformers runs when it loads one)")
    global_scale: Literal["dynamic", "static"] | None = Field(
        None, description="nvfp4 and int8: dynamic (null) takes the scale from each input (int8: each token's); "
        "static calibrates one per linear on the calibration text (nvfp4: compressed-tensors' input_global_scale, "
        "which its export needs; int8: a per-tensor scale, the static W8A8 of compressed-tensors and vLLM)")

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
        if self.scale_divisor is not None and self.format != "int8":
            raise ValueError(f"scale_divisor is int8's; {self.format} takes scales of its own kind")
        if self.global_scale is not None and self.format not in STATIC_SCALES:
            raise ValueError(f"global_scale is for {' and '.join(sorted(STATIC_SCALES))}; {self.format} takes its "
                             "scales from each input")
        return self

    @property
    def static(self) -> bool:
        """Whether the rounding holds a global scale calibrated on data (so the format needs calibration)."""
        return self.global_scale == "static"

    @property
    def label(self) -> str:
        return ("a" + self.format + (f"-g{self.group_size}" if self.group_size else "")
                + (f"-{self.scale_rounding}" if self.scale_rounding not in (None, "floor") else "")
                + (f"-d{self.scale_divisor:g}" if self.scale_divisor not in (None, 127.0) else "")
                + ("-static" if self.static else ""))

    @property
    def block(self) -> int:
        """The feature count the input must be a multiple of."""
        return self.group_size if self.format == "fp8" and self.group_size else ROUNDINGS[self.format][1]

    def module(self) -> "ActivationRounding":
        return ActivationRounding(self.format, self.group_size, self.scale_rounding, self.static, self.scale_divisor)


def rounding_module(fmt: ActivationFormat | None) -> "ActivationRounding | None":
    """The input rounding of a format's ``activations`` field, or None (weight-only)."""
    return None if fmt is None else fmt.module()


def round_activations(x: torch.Tensor, fmt: str, group_size: int | None = None,
                      scale_rounding: str | None = None, global_scale: torch.Tensor | None = None,
                      scale_divisor: float | None = None) -> torch.Tensor:
    """``x [..., features]`` rounded to ``fmt``'s grid with dynamic scales (under ``global_scale`` where given:
    nvfp4's static one) and returned in ``x``'s dtype."""
    shape, dtype = x.shape, x.dtype
    rows = x.reshape(-1, shape[-1]).float()
    if fmt == "fp8":
        out = fp8_rows(rows, group_size)
    elif fmt == "int8":
        out = int8_rows(rows, global_scale, scale_divisor or 127.0)
    elif global_scale is not None:
        out = ROUNDINGS[fmt][0](rows, global_scale=global_scale)
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


def int8_rows(rows: torch.Tensor, global_scale: torch.Tensor | None = None, divisor: float = 127.0) -> torch.Tensor:
    """Symmetric int8 with a scale per row (token), its largest ``|x|`` over ``divisor`` (127: vLLM's
    ``scaled_int8_quant``; 127.5: compressed-tensors' ``calculate_qparams``), or the tensor's static
    ``global_scale``; rounding to nearest even and saturating to [-128, 127], as both do."""
    if global_scale is None:
        amax = rows.abs().amax(-1, keepdim=True)
        scale = torch.where(amax > 0, amax / divisor, torch.ones_like(amax))
    else:
        scale = global_scale.float().reshape(1, 1)
    return torch.round(rows / scale).clamp(-128, 127) * scale


register_rounding("int8", int8_rows, 1, static_scale=lambda amax: torch.where(amax > 0, amax.float() / 127.0,
                                                                                torch.ones_like(amax.float())))


class ActivationRounding(nn.Module):
    """The input rounding a quantized linear applies before its product. A static one holds ``input_global_scale``
    (float32 ``[1]``) and ``input_amax`` (the largest ``|x|`` it has observed), set by ``calibrate_activations_``."""

    def __init__(self, fmt: str, group_size: int | None = None, scale_rounding: str | None = None,
                 static: bool = False, scale_divisor: float | None = None) -> None:
        super().__init__()
        self.fmt, self.group_size, self.scale_rounding, self.static = fmt, group_size, scale_rounding, static
        self.scale_divisor = scale_divisor
        self.observing = False
        self.calibrated = False  # a static one: set by calibrate_activations_
        if static:
            self.register_buffer("input_global_scale", torch.full((1,), float("nan")))
            self.register_buffer("input_amax", torch.zeros(1))

    @property
    def spec(self) -> ActivationFormat:
        """The ``activations:`` entry this module rounds by."""
        return ActivationFormat(format=self.fmt, group_size=self.group_size,
                                scale_rounding=getattr(self, "scale_rounding", None),
                                scale_divisor=getattr(self, "scale_divisor", None),
                                global_scale="static" if getattr(self, "static", False) else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "static", False):
            return round_activations(x, self.fmt, self.group_size, getattr(self, "scale_rounding", None),
                                     scale_divisor=getattr(self, "scale_divisor", None))
        if self.observing:  # static_minmax: the running maximum, the scale from it, this input rounded by it
            self.input_amax.copy_(torch.maximum(self.input_amax, x.detach().abs().amax().float().reshape(1)))
            self.input_global_scale.copy_(STATIC_SCALES[self.fmt](self.input_amax))
        elif not self.calibrated:
            raise RuntimeError("this linear's static input global scale was never calibrated "
                               "(quantize_ with calibration data calibrates it)")
        return round_activations(x, self.fmt, global_scale=self.input_global_scale)

    @property
    def rounds_now(self) -> bool:
        """Whether the rounding is settled (not observing a calibration pass), so a kernel may fuse it."""
        return not self.observing and (self.calibrated or not getattr(self, "static", False))

    def extra_repr(self) -> str:
        return self.spec.label[1:]


def static_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' ``generate_gparam`` for NVFP4: ``448 · 6 / amax`` in float32 (1 where that is not
    finite: an input that was all zeros)."""
    scale = 448.0 * 6.0 / amax.float().clamp(min=torch.finfo(torch.float32).tiny)
    return torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))


@torch.no_grad()
def calibrate_activations_(model: nn.Module, samples: list[torch.Tensor]) -> int:
    """Calibrate every static input rounding of ``model`` on ``samples`` (token ids ``[1, seq]``), one forward pass
    each, all of them observing at once; returns how many were calibrated (0: nothing was run)."""
    static = [m for m in model.modules() if isinstance(m, ActivationRounding) and getattr(m, "static", False)]
    if not static:
        return 0
    device = next(p.device for p in model.parameters())
    for m in static:
        m.input_amax.zero_()
        m.observing = True
    try:
        for ids in samples:
            model(input_ids=ids.to(device), use_cache=False)
    finally:
        for m in static:
            m.observing = False
    for m in static:
        m.calibrated = True
    return len(static)
