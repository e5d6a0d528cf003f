"""Pure tensor functions for affine quantization and sub-byte packing.

Conventions (as in GPTQ): integer codes ``q`` lie in ``[0, 2**bits - 1]`` and
dequantize as ``(q - zero) * scale``. Symmetric formats use the implied zero
``2**(bits - 1)`` and a scale that maps ``max |x|`` to ``2**(bits - 1) - 1``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import UnsupportedError


def max_code(bits: int) -> int:
    return (1 << bits) - 1


_PACK_MULTIPLE = tuple(8 // math.gcd(bits, 8) for bits in range(9))  # a table: traceable inside a compiled graph


def pack_multiple(bits: int) -> int:
    """Smallest count of values whose bits fill whole bytes (2 for 4-bit, 8 for 3-bit)."""
    return _PACK_MULTIPLE[bits]


def packed_row_bytes(n_values: int, bits: int) -> int:
    """Bytes that ``pack`` uses for a row of ``n_values`` codes."""
    m = pack_multiple(bits)
    return -(-n_values // m) * m * bits // 8


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes (< 2**bits) along the last dimension into uint8, little-endian bit order."""
    if bits == 8:
        return codes.to(torch.uint8).contiguous()
    *lead, n = codes.shape
    m = pack_multiple(bits)
    padded = -(-n // m) * m
    c = torch.nn.functional.pad(codes.to(torch.int64), (0, padded - n)).reshape(*lead, padded // m, m)
    shifts = torch.arange(m, device=codes.device, dtype=torch.int64) * bits
    words = (c << shifts).sum(dim=-1, keepdim=True)  # m*bits <= 56 bits: fits int64
    byte_shifts = torch.arange(m * bits // 8, device=codes.device, dtype=torch.int64) * 8
    return ((words >> byte_shifts) & 0xFF).to(torch.uint8).reshape(*lead, -1)


def unpack(packed: torch.Tensor, bits: int, n_values: int) -> torch.Tensor:
    """Inverse of ``pack``: uint8 codes of length ``n_values`` along the last dimension."""
    if bits == 8:
        return packed[..., :n_values]
    if bits in (1, 2, 4):  # whole codes per byte: one shift-and-mask per position, without widening
        codes = torch.stack([(packed >> shift) & max_code(bits) for shift in range(0, 8, bits)], dim=-1)
        return codes.reshape(*packed.shape[:-1], -1)[..., :n_values]
    # Odd widths: bytes come in words of pack_multiple codes; code j of every word lies at the same bit
    # offset, within one byte or across two. One strided shift-and-mask per code position, in int16.
    *lead, nbytes = packed.shape
    m = pack_multiple(bits)
    per_word = m * bits // 8
    b = packed.reshape(*lead, nbytes // per_word, per_word).to(torch.int16)
    parts = []
    for j in range(m):
        i, offset = divmod(j * bits, 8)
        word = b[..., i] if offset + bits <= 8 else b[..., i] | (b[..., i + 1] << 8)
        parts.append((word >> offset) & max_code(bits))
    return torch.stack(parts, dim=-1).reshape(*lead, -1)[..., :n_values].to(torch.uint8)


def check_finite(x: torch.Tensor) -> None:
    """Refuse NaN or Inf (not checked inside a compiled graph: a KV cache quantizing as it decodes)."""
    if torch.compiler.is_compiling():
        return
    if not torch.isfinite(x).all():
        raise UnsupportedError("cannot quantize a tensor that contains NaN or Inf")


def _round_up_in_graph(scale: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
    """``round_scale_up`` inside a compiled graph, giving the same bits (non-negative scales): without its
    data-dependent branches, and for float16 reading the stored value back from its bits, since inductor keeps
    a float16 intermediate (and ``nextafter`` on it) in float32."""
    if stored.dtype == torch.float32:
        return stored
    if stored.dtype != torch.float16:
        return torch.where(stored.float() < scale, torch.nextafter(stored, torch.full_like(stored, float("inf"))), stored)
    bits = stored.view(torch.int16)
    exponent, mantissa = (bits.to(torch.int32) >> 10) & 0x1F, (bits & 0x3FF).float()
    value = torch.where(exponent == 0, mantissa * 2.0 ** -24, (mantissa / 1024 + 1) * torch.exp2((exponent - 15).float()))
    return torch.where(value < scale, bits + 1, bits).view(torch.float16)  # from bits: read back as stored


def round_scale_up(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast scales to their storage dtype, never below the exact value (so the range is never clipped)."""
    stored = scale.to(dtype)
    if torch.compiler.is_compiling():
        return _round_up_in_graph(scale, stored)
    if not torch.isfinite(stored).all():
        raise UnsupportedError(f"scales overflow {dtype}; store them in float32")
    low = stored.float() < scale
    if low.any():
        stored = torch.where(low, torch.nextafter(stored, torch.full_like(stored, float("inf"))), stored)
    return stored


def qparams_from_range(
    lo: torch.Tensor, hi: torch.Tensor, bits: int, symmetric: bool, scale_dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero point for groups whose values lie in ``[lo, hi]``.

    The range is widened to contain 0 (as GPTQ does), so zeros are exact. All-zero groups get
    scale 1; constant groups dequantize exactly (when the constant is representable in ``scale_dtype``).
    """
    constant = lo == hi
    if symmetric:
        amax = torch.maximum(lo.abs(), hi.abs())
        scale = amax / ((1 << (bits - 1)) - 1)
        scale = torch.where(constant, amax, scale)  # a constant group is one step from zero: exact
        scale = torch.where(amax == 0, torch.ones_like(scale), scale)
        scale = round_scale_up(scale, scale_dtype)
        zero = torch.full_like(scale, 1 << (bits - 1), dtype=torch.uint8)
        return scale, zero
    xmin, xmax = lo.clamp(max=0), hi.clamp(min=0)
    scale = (xmax - xmin) / max_code(bits)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scale = round_scale_up(scale, scale_dtype)
    zero = torch.round(-xmin / scale.float()).clamp(0, max_code(bits))
    # A constant group c != 0 gets scale |c| and code zero +- 1, so it dequantizes exactly.
    zero = torch.where(constant & (lo < 0), torch.ones_like(zero), torch.where(constant, torch.zeros_like(zero), zero))
    scale = torch.where(constant & (lo != 0), round_scale_up(lo.abs(), scale_dtype), scale)
    return scale, zero.to(torch.uint8)


@dataclass(frozen=True)
class ClipSearch:
    """Shrink each group's range over a grid and keep the one with the least ``|x - x̂|^norm`` (GPTQ's MSE option)."""

    grid: int = 100
    max_shrink: float = 0.8
    norm: float = 2.4


def choose_qparams(
    x: torch.Tensor, bits: int, symmetric: bool, scale_dtype: torch.dtype = torch.float16,
    clip: ClipSearch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per group of ``x [..., group]`` (reduced over the last dim); see ``qparams_from_range``."""
    check_finite(x)
    x = x.float()
    lo, hi = x.amin(dim=-1), x.amax(dim=-1)
    scale, zero = qparams_from_range(lo, hi, bits, symmetric, scale_dtype)
    if clip is None:
        return scale, zero

    def error(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (dequantize_affine(quantize_affine(x, s, z, bits), s, z) - x).abs().pow(clip.norm).sum(-1)

    best = error(scale, zero)
    for i in range(1, int(clip.max_shrink * clip.grid) + 1):
        shrink = 1 - i / clip.grid
        s, z = qparams_from_range(lo * shrink, hi * shrink, bits, symmetric, scale_dtype)
        err = error(s, z)
        better = err < best
        best = torch.where(better, err, best)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return scale, zero


def quantize_affine(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes for ``x [..., group]`` given per-group ``scale`` and ``zero`` of shape ``[...]``."""
    q = torch.round(x.float() / scale.float().unsqueeze(-1)) + zero.float().unsqueeze(-1)
    return q.clamp(0, max_code(bits)).to(torch.uint8)


def dequantize_affine(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``(q - zero) * scale`` broadcast over the last (group) dimension, computed in float32."""
    s = scale.float().unsqueeze(-1)
    return torch.addcmul(-zero.float().unsqueeze(-1) * s, q.float(), s).to(dtype)
