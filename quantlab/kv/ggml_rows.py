"""llama.cpp's KV block types as rows of a cache: the numerics of the ``ggml`` KV formats (``ggml.py``).

``q8_0`` (blocks of 32 int8 codes, a float16 scale ``max|x| / 127``) and
``q4_0`` (blocks of 32 4-bit codes, a float16 scale ``x_max / -8`` where ``x_max`` is the signed value of largest
magnitude), each position's key and value heads rounded as ggml's reference quantizer rounds them
(``quantize_row_q8_0_ref`` / ``quantize_row_q4_0_ref``), stored in ggml's bytes per block (34 and 18), with no
full-precision window (llama.cpp keeps none)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # QK8_0 = QK4_0
GGML_ELEMENTS = {"q8_0": 8, "q4_0": 4}  # code bits


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: to nearest, ties away from zero (``torch.round`` ties to even)."""
    t = torch.trunc(x)
    return torch.where((x - t).abs() >= 0.5, t + torch.sign(x), t)


@dataclass
class GGMLRows:
    """Rows of ``d`` values as ggml blocks: ``codes`` (q8_0: int8 ``[rows, d]``; q4_0: uint8 ``[rows, d / 2]``, per
    block the low nibbles holding its first 16 values and the high its last 16, as ggml packs them) and ``scales``
    (float16 ``[rows, d / 32]``)."""

    codes: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    element: str

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        rows, d = self.shape
        scale = self.scales.float().reshape(rows, d // BLOCK, 1)
        if self.element == "q8_0":
            q = self.codes.float().reshape(rows, d // BLOCK, BLOCK)
        else:
            packed = self.codes.reshape(rows, d // BLOCK, BLOCK // 2)
            q = torch.cat([packed & 0xF, packed >> 4], dim=-1).float() - 8
        return (q * scale).reshape(rows, d).to(dtype)


def quantize_rows(x: torch.Tensor, element: str) -> GGMLRows:
    """``x [rows, d]`` (``d`` a multiple of 32) rounded as ggml's reference quantizer for ``element`` rounds it,
    in float32: the scale's inverse ``1 / d`` multiplies, the stored scale is ``d`` in float16."""
    rows, d = x.shape
    blocks = x.float().reshape(rows, d // BLOCK, BLOCK)
    if element == "q8_0":
        scale = blocks.abs().amax(-1, keepdim=True) / 127
        inverse = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
        codes = _round_half_away(blocks * inverse).to(torch.int8).reshape(rows, d)
    else:  # q4_0: the first value of largest magnitude, with its sign, maps to -8
        signed_max = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
        scale = signed_max / -8
        inverse = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
        q = torch.clamp(torch.trunc(blocks * inverse + 8.5), max=15).to(torch.uint8)  # (int8_t) then MIN(15, ·)
        codes = (q[..., : BLOCK // 2] | (q[..., BLOCK // 2:] << 4)).reshape(rows, d // 2)
    return GGMLRows(codes, scale.reshape(rows, d // BLOCK).to(torch.float16), (rows, d), element)


def rows_nbytes(rows: int, d: int, element: str) -> int:
    """Bytes of ``rows`` heads of ``d`` in ``element``: ggml's block sizes (q8_0 34, q4_0 18 per 32 values)."""
    return rows * (d // BLOCK) * (BLOCK * GGML_ELEMENTS[element] // 8 + 2)


def rows_from_bytes(codes: torch.Tensor, scales: torch.Tensor, shape: tuple[int, int], element: str) -> GGMLRows:
    """The rows a static store holds as bytes (``codes``, ``scales`` viewed as uint8)."""
    codes = codes.view(torch.int8) if element == "q8_0" else codes
    return GGMLRows(codes, scales.view(torch.float16), shape, element)
