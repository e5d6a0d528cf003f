"""Integer codes with a float zero point per group: the stored form of HQQ (``hqq.py``: half-quadratic optimization
of the zero point, calibration free) and of round-to-nearest with ``zero_point: float``.

With an integer zero point the range is widened to contain 0 and the zero lands on a code; a float zero point
fits each group's range exactly, ``(code - zero) * scale`` with ``scale = (max - min) / (2^bits - 1)`` and
``zero = -min / scale`` (quanto's and HQQ's form). HQQ then refines the zero point by a proximal solver of
``|W - dequantize(quantize(W))|_p`` (p = 0.7, beta 10, up to 20 steps, stopping when the mean error stops
falling), as the hqq library's ``Quantizer`` does by default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ....errors import UnsupportedError
from ...tensors.base import Spec, WeightTensor
from ...tensors.primitives import check_finite, max_code, pack, packed_row_bytes, unpack


@dataclass
class FloatZeroTensor(WeightTensor):
    """Packed ``bits``-bit codes with a scale and a float zero point per row and group of the input."""

    packed: torch.Tensor  # uint8 [out, packed_row_bytes(in, bits)]
    scales: torch.Tensor  # [out, n_groups], the scale dtype
    zeros: torch.Tensor  # [out, n_groups], the scale dtype: zero points in code units, not rounded
    shape: tuple[int, int]
    bits: int
    group_size: int | None
    g_idx: ClassVar[None] = None  # groups are always contiguous (no act-order)

    form = "float_zero"
    symmetric: ClassVar[bool] = False

    def spec(self) -> Spec:
        return Spec(self.form, {"bits": self.bits, "group_size": self.group_size, "symmetric": False,
                                "per_tensor": False, "act_order": False})

    def describe(self) -> str:
        g = "per channel" if self.group_size is None else f"group {self.group_size}"
        return f"{self.bits}-bit {g}, float zero points"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("packed", "scales", "zeros")

    def row_scales(self) -> torch.Tensor:
        """Scales as ``[out, n_groups]``."""
        return self.scales

    def row_zero_points(self) -> torch.Tensor:
        """Zero points in code units as ``[out, n_groups]``, not rounded: the int4 kernels' ``(code - 8) * scale +
        zero`` form takes them exactly (``zero = (8 - z) * scale``), as tinygemm was made for."""
        return self.zeros

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int], bits: int, group_size: int | None, param_bytes: int) -> int:
        out, n_in = shape
        groups = 1 if group_size is None else n_in // group_size
        return out * packed_row_bytes(n_in, bits) + 2 * out * groups * param_bytes

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape, self.bits, self.group_size, self.scales.element_size())

    def codes(self, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        return unpack(self.packed[rows], self.bits, self.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        codes = self.codes(rows).float()
        n = codes.shape[0]
        grouped = codes.reshape(n, self.scales.shape[1], -1)
        w = (grouped - self.zeros[rows].float().unsqueeze(-1)) * self.scales[rows].float().unsqueeze(-1)
        return w.reshape(n, -1).to(dtype)


def _groups(x: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``x [out, in]`` as ``[out, n_groups, group]``; the group size must divide the input."""
    out, n_in = x.shape
    if group_size is not None and n_in % group_size:
        raise UnsupportedError(f"float zero points need a group size that divides the input: {group_size} does not "
                               f"divide {n_in}")
    return x.float().reshape(out, 1 if group_size is None else n_in // group_size, -1)


def _shrink_lp(x: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """The proximal operator of ``|x|_p^p / beta`` (HQQ's generalized soft threshold)."""
    return torch.sign(x) * (x.abs() - (1.0 / beta) * x.abs().pow(p - 1)).clamp_min(0.0)


def optimize_zero(w: torch.Tensor, inv_scale: torch.Tensor, zero: torch.Tensor, bits: int, p: float = 0.7,
                  beta: float = 10.0, iters: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """HQQ's half-quadratic solve of the zero points of groups ``w [..., group]`` (``inv_scale``: codes per unit),
    step for step as the hqq library's default (``optimize_weights_proximal_legacy``). Returns ``(codes, zero)``."""
    best = float("inf")
    for _ in range(iters):
        q = torch.round(w * inv_scale + zero).clamp(0, max_code(bits))
        reconstructed = (q - zero) / inv_scale
        zero = torch.mean(q - (w - _shrink_lp(w - reconstructed, beta, p)) * inv_scale, dim=-1, keepdim=True)
        error = (w - reconstructed).abs().mean().item()  # of the step's input zero points, over the whole tensor
        if error >= best:
            break
        best = error
    return torch.round(w * inv_scale + zero).clamp(0, max_code(bits)), zero


def quantize_float_zero(x: torch.Tensor, bits: int, group_size: int | None = 64, optimize: bool = False,
                        scale_dtype: torch.dtype = torch.float16, round_zero: bool = False) -> FloatZeroTensor:
    """Round-to-nearest with each group's exact range (``optimize``: then HQQ's zero-point solve) of ``x [out, in]``;
    ``round_zero``: the starting zero points rounded to codes first, as the hqq library's ``round_zero``."""
    if x.dim() != 2:
        raise UnsupportedError(f"expected a 2-D tensor, got shape {tuple(x.shape)}")
    check_finite(x)
    w = _groups(x, group_size)
    lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))  # a constant group: codes 0, zero -c, exact
    inv_scale = max_code(bits) / span
    zero = -lo * inv_scale
    if round_zero:
        zero = torch.round(zero)
    if optimize:
        q, zero = optimize_zero(w, inv_scale, zero, bits)
    else:
        q = torch.round(w * inv_scale + zero).clamp(0, max_code(bits))
    out, n_in = x.shape
    codes = q.to(torch.uint8).reshape(out, n_in)
    return FloatZeroTensor(pack(codes, bits), (1.0 / inv_scale).squeeze(-1).to(scale_dtype),
                           zero.squeeze(-1).to(scale_dtype), (out, n_in), bits, group_size)
