"""``smoothquant``: SmoothQuant's migration of activation outliers into the weights (Xiao et al., 2023), as
llm-compressor's ``SmoothQuantModifier`` computes it.

For the linears that read one norm's output (Llama's q/k/v after ``input_layernorm``, gate/up after
``post_attention_layernorm``, Gemma's after its pre-feedforward norm), each input channel ``j`` gets the scale
``s_j = r_j^α / w_j^(1-α)``: ``r_j`` the channel's dynamic range (max − min of the norm's output over the
calibration text), ``w_j`` twice the largest ``|W[:, j]|`` over those linears (``s_j = r_j`` where that is 0),
at least 1e-5. The norm's weight is divided by ``s`` (for a norm that multiplies by ``1 + weight``, as Gemma's
does, ``1 + weight`` is) and each linear's columns are multiplied by it: the model computes the same function, and
an activation rounding (W8A8) meets inputs whose outlier channels are ``s`` times smaller.

The norms are found on the calibration pass: a linear whose input is the very tensor an RMSNorm returned reads
that norm. Linears that read no norm's output (o_proj, down_proj) are smoothed the same way by their own input's
range, kept as an input scale (``x / s`` before the product: not exportable), or, with ``others: skip``, left
as llm-compressor leaves them.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from .base import TRANSFORMS, Transform

MINIMUM_SCALE = 1e-5  # llm-compressor's MINIMUM_SMOOTHING_SCALE


class InputScale(nn.Module):
    """``x ↦ x / s`` per input channel, in the input's dtype."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("inverse", 1.0 / scale.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * self.inverse).to(x.dtype)


class Range:
    """The running per-channel minimum and maximum of the tensors observed."""

    def __init__(self) -> None:
        self.lo: torch.Tensor | None = None
        self.hi: torch.Tensor | None = None

    def observe(self, x: torch.Tensor) -> None:
        rows = x.detach().reshape(-1, x.shape[-1]).float()
        lo, hi = rows.amin(0), rows.amax(0)
        self.lo = lo if self.lo is None else torch.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else torch.maximum(self.hi, hi)

    @property
    def width(self) -> torch.Tensor:
        assert self.lo is not None and self.hi is not None
        return self.hi - self.lo


def norm_offset(norm: nn.Module) -> float | None:
    """1.0 for a norm that multiplies by ``1 + weight`` (Gemma's), 0.0 for one that multiplies by ``weight``
    (Llama's), found by running it; None when it is neither (not an RMSNorm this transform can fold into)."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None
    x = torch.randn(3, weight.numel(), generator=torch.Generator().manual_seed(0)).to(weight.device, weight.dtype)
    with torch.no_grad():
        got = norm(x).float()
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + getattr(norm, "eps", getattr(
        norm, "variance_epsilon", 1e-6)))
    for offset in (0.0, 1.0):
        if torch.allclose(got, normed * (offset + weight.float()), rtol=1e-3, atol=1e-3):
            return offset
    return None


def smoothing_scales(ranges: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """llm-compressor's ``_calculate_smoothing_scales`` and its floor: ``ranges^α / (2 max|W_j|)^(1-α)`` over the
    weights' columns (``ranges`` where a column is all zeros), at least ``MINIMUM_SCALE``."""
    weight_scales = 2.0 * torch.stack([w.float().abs().amax(0) for w in weights]).amax(0)
    scales = ranges.pow(alpha) / weight_scales.pow(1 - alpha)
    scales = torch.where(weight_scales > 0.0, scales, ranges)
    return torch.clamp(scales, min=MINIMUM_SCALE)


@TRANSFORMS.register("smoothquant", "migrate activation outliers into the weights by per-channel scales calibrated "
                     "on the recipe's text, folded into the preceding norm; fields: alpha, others")
class SmoothQuant(Transform):
    example_fields: ClassVar[dict[str, Any]] = {"alpha": 0.5}
    requires_calibration: ClassVar[bool] = True
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="migration strength: 0 leaves the activations, 1 moves "
                         "their whole range into the weights (llm-compressor's smoothing_strength)")
    others: Literal["input-scale", "skip"] = Field(
        "input-scale", description="linears whose input no norm produces (o_proj, down_proj): smoothed by an input "
        "scale kept in the layer (x / s before the product; not exportable), or skip: left as they are, as "
        "llm-compressor leaves them")

    @property
    def label(self) -> str:
        return f"sq{self.alpha:g}" + ("" if self.others == "input-scale" else "n")

    @property
    def folds_entirely(self) -> bool:
        return self.others == "skip"

    def apply_(self, model: nn.Module, names: list[str], steps: dict[str, list[nn.Module]],
               samples: list[torch.Tensor] | None) -> None:
        if not samples:
            raise ValueError("smoothquant calibrates its scales on data: give calibration samples")
        readers, ranges = observe(model, names, samples)
        for norm_name, linears in readers.items():
            self._fold(model, norm_name, linears, ranges[norm_name].width)
        if self.others == "skip":
            return
        for name in names:
            if not any(name in linears for linears in readers.values()):
                weight = model.get_submodule(name).weight
                scales = smoothing_scales(ranges[name].width, [weight.data], self.alpha)
                weight.data = (weight.data.float() * scales).to(weight.dtype)
                steps[name].append(InputScale(scales))

    def _fold(self, model: nn.Module, norm_name: str, linears: list[str], width: torch.Tensor) -> None:
        norm = model.get_submodule(norm_name)
        offset = norm_offset(norm)
        assert offset is not None  # observe() keeps only norms it can fold into
        weights = [model.get_submodule(n).weight for n in linears]
        scales = smoothing_scales(width, [w.data for w in weights], self.alpha)
        norm.weight.data = ((offset + norm.weight.data.float()) / scales - offset).to(norm.weight.dtype)
        for w in weights:
            w.data = (w.data.float() * scales).to(w.dtype)


@torch.no_grad()
def observe(model: nn.Module, names: list[str], samples: list[torch.Tensor]
            ) -> tuple[dict[str, list[str]], dict[str, Range]]:
    """One pass over ``samples``: which selected linears read which foldable norm's output (norm name -> linear
    names), and the per-channel range of every norm's output and every linear's input (by module name)."""
    norms = {n: m for n, m in model.named_modules() if "norm" in type(m).__name__.lower() and norm_offset(m) is not None}
    ranges: dict[str, Range] = {n: Range() for n in [*norms, *names]}
    produced: dict[int, tuple[str, torch.Tensor]] = {}  # a tensor a norm returned on this pass (held, so its id
    # is not reused within the pass) -> the norm
    votes: dict[str, set[str | None]] = {n: set() for n in names}
    hooks = []
    for n, m in norms.items():
        def after(module: nn.Module, args: Any, out: torch.Tensor, n: str = n) -> None:
            ranges[n].observe(out)
            produced[id(out)] = (n, out)
        hooks.append(m.register_forward_hook(after))
    for n in names:
        def before(module: nn.Module, args: tuple[Any, ...], n: str = n) -> None:
            ranges[n].observe(args[0])
            found = produced.get(id(args[0]))
            votes[n].add(found[0] if found is not None and found[1] is args[0] else None)
        hooks.append(model.get_submodule(n).register_forward_pre_hook(before))
    device = next(p.device for p in model.parameters())
    try:
        for ids in samples:
            produced.clear()
            model(input_ids=ids.to(device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    readers: dict[str, list[str]] = {}
    for n in names:  # a linear reads a norm when every pass handed it that norm's output
        if len(votes[n]) == 1 and (norm := next(iter(votes[n]))) is not None:
            readers.setdefault(norm, []).append(n)
    return readers, ranges
