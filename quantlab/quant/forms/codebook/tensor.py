"""The codebook stored form: NF4 and FP4 as bitsandbytes defines them (QLoRA's storage).

The weight, read row-major as one flat sequence, is cut into blocks of ``block_size`` values; each block is
divided by its absolute maximum and every value becomes the index of the nearest of 16 codebook values (ties to
the lower one, as bitsandbytes' bucketize does). NF4's codebook holds the quantiles of a normal distribution,
FP4's the values of a 1-2-1 float. With double quantization the block maxima are themselves stored in 8 bits:
their mean is subtracted and they are quantized with bitsandbytes' signed dynamic map in blocks of 256, each
with a float32 scale (0.5 bits per weight at blocks of 64 become about 0.127).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ....errors import UnsupportedError
from ...tensors.base import Spec, WeightTensor
from ...tensors.primitives import check_finite, pack, packed_row_bytes, unpack

CODEBOOKS: dict[str, tuple[float, ...]] = {
    "nf4": (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
            0.7229568362236023, 1.0),
    # sign, 2 exponent bits, 1 mantissa bit, in bit-pattern order, divided by the largest (12)
    "fp4": tuple(v / 12 for v in (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0,
                                  -2.0, -3.0)),
}
SCALE_BLOCK = 256  # block maxima per 8-bit block of their own under double quantization
BLOCK_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


@functools.cache
def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map (``create_dynamic_map(signed=True)``): 256 sorted values in [-1, 1]."""
    data: list[float] = []
    exponent_bits, non_sign_bits = 7, 7
    for i in range(exponent_bits):
        items = 2 ** (i + non_sign_bits - exponent_bits) + 1
        bounds = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = ((bounds[:-1] + bounds[1:]) / 2.0)
        data += ((10 ** (-(exponent_bits - 1) + i)) * means).tolist()
        data += (-(10 ** (-(exponent_bits - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return torch.tensor(sorted(data), dtype=torch.float32)


def nearest_code(scaled: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of the nearest codebook value for values in [-1, 1]; a tie goes to the lower value."""
    order = torch.argsort(codebook)
    ordered = codebook[order]
    bounds = (ordered[:-1] + ordered[1:]) / 2
    return order[torch.bucketize(scaled, bounds.to(scaled.device))].to(torch.uint8)


def _blockwise(flat: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(absmax per block, values divided by their block's absmax, clamped to [-1, 1])`` of a flat float32 tensor;
    a shorter last block is a block of its own."""
    n = flat.numel()
    padded = torch.nn.functional.pad(flat, (0, -n % block)).reshape(-1, block)
    absmax = padded.abs().amax(dim=1)
    scaled = (padded * (1.0 / absmax.clamp(min=1e-38)).unsqueeze(1)).clamp(-1, 1).reshape(-1)[:n]
    return absmax, scaled


@dataclass
class CodebookTensor(WeightTensor):
    """4-bit codebook indices with a float32 absolute maximum per block (or 8-bit ones, double-quantized)."""

    packed: torch.Tensor  # uint8 [out, packed_row_bytes(in, 4)]: codebook indices, two per byte, low nibble first
    absmax: torch.Tensor  # float32 [n_blocks], or uint8 [n_blocks] dynamic-map indices when double-quantized
    absmax_scale: torch.Tensor | None  # float32 [ceil(n_blocks / 256)] (double quantization)
    absmax_offset: torch.Tensor | None  # float32 [1]: the mean subtracted before (double quantization)
    shape: tuple[int, int]
    codebook: str  # a key of CODEBOOKS
    block_size: int

    bits = 4
    form = "codebook"

    def spec(self) -> Spec:
        return Spec(self.form, {"codebook": self.codebook, "block_size": self.block_size})

    def describe(self) -> str:
        return f"{self.codebook} codebook, blocks of {self.block_size}"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("packed", "absmax", "absmax_scale", "absmax_offset")

    @property
    def group_size(self) -> int:
        return self.block_size

    @property
    def double_quantized(self) -> bool:
        return self.absmax_scale is not None

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int], block_size: int, double_quant: bool) -> int:
        out, n_in = shape
        blocks = -(-out * n_in // block_size)
        scales = blocks + 4 * -(-blocks // SCALE_BLOCK) + 4 if double_quant else 4 * blocks
        return out * packed_row_bytes(n_in, 4) + scales

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape, self.block_size, self.double_quantized)

    def block_maxima(self) -> torch.Tensor:
        """The absolute maximum of every block, float32 (decoded when double-quantized)."""
        if not self.double_quantized:
            return self.absmax
        code = dynamic_map().to(self.absmax.device)[self.absmax.long()]
        scale = self.absmax_scale.repeat_interleave(SCALE_BLOCK)[: code.numel()]
        return code * scale + self.absmax_offset

    def codes(self, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        return unpack(self.packed[rows], 4, self.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        out, n_in = self.shape
        start, stop, _ = rows.indices(out)
        codes = self.codes(rows)
        values = torch.tensor(CODEBOOKS[self.codebook], device=codes.device)[codes.long()]
        flat = torch.arange(start * n_in, stop * n_in, device=codes.device).reshape(-1, n_in)
        return (values * self.block_maxima()[flat // self.block_size]).to(dtype)


def quantize_codebook(x: torch.Tensor, codebook: str = "nf4", block_size: int = 64,
                      double_quant: bool = False) -> CodebookTensor:
    """Blockwise absmax codebook quantization of a 2-D tensor ``[out, in]`` (bitsandbytes' ``quantize_4bit``)."""
    if x.dim() != 2:
        raise UnsupportedError(f"quantize_codebook expects a 2-D tensor, got shape {tuple(x.shape)}")
    if block_size not in BLOCK_SIZES:
        raise UnsupportedError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
    check_finite(x)
    out, n_in = x.shape
    absmax, scaled = _blockwise(x.reshape(-1).float(), block_size)
    codes = nearest_code(scaled, torch.tensor(CODEBOOKS[codebook], device=x.device)).reshape(out, n_in)
    scale = offset = None
    if double_quant:
        offset = absmax.mean().reshape(1)
        scale, scaled_maxima = _blockwise(absmax - offset, SCALE_BLOCK)
        absmax = nearest_code(scaled_maxima, dynamic_map().to(x.device))
    return CodebookTensor(pack(codes, 4), absmax, scale, offset, (out, n_in), codebook, block_size)
