"""The float8 stored form: e4m3 or e5m2 values with a float32 scale per output channel or per tensor.

Each weight is divided by its scale (the row's or the tensor's absolute maximum over the format's largest value,
so the maximum maps onto it) and cast to the float8 dtype, which rounds to nearest even: the numerics of a plain
``(w / scale).to(torch.float8_e4m3fn)``."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ....errors import UnsupportedError
from ...tensors.base import Spec, WeightTensor
from ...tensors.primitives import check_finite

FP8_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def fp8_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, FP8_DTYPES[name], None)
    if dtype is None:
        raise UnsupportedError(f"this torch has no {FP8_DTYPES[name]}")
    return dtype


@dataclass
class Float8Tensor(WeightTensor):
    """Float8 values ``[out, in]`` and float32 scales: ``[out, 1]`` (per channel), ``[1, 1]`` (per tensor) or, with
    ``block_size``, one per ``block_size x block_size`` tile, ``[ceil(out / b), ceil(in / b)]`` (DeepSeek-V3's and
    compressed-tensors' FP8_BLOCK; tiles at the edges are partial)."""

    data: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    block_size: int | None = None

    form = "float8"

    @property
    def element(self) -> str:
        return "e4m3" if self.data.dtype == torch.float8_e4m3fn else "e5m2"

    @property
    def per_tensor(self) -> bool:
        """One scale for the whole tensor."""
        return self.block_size is None and self.scales.numel() == 1 and self.shape[0] > 1

    def spec(self) -> Spec:
        return Spec(self.form, {"element": self.element, "per_tensor": self.per_tensor, "block_size": self.block_size})

    def describe(self) -> str:
        scale = f"blocks of {self.block_size}" if self.block_size else "per tensor" if self.per_tensor else "per channel"
        return f"float8 {self.element}, {scale}"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("data", "scales")

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int], per_tensor: bool, block_size: int | None = None) -> int:
        if block_size:
            return shape[0] * shape[1] + 4 * (-(-shape[0] // block_size)) * (-(-shape[1] // block_size))
        return shape[0] * shape[1] + 4 * (1 if per_tensor else shape[0])

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape, self.scales.shape[0] == 1 and self.shape[0] > 1, self.block_size)

    def row_scales(self, rows: slice | None = None) -> torch.Tensor:
        """The scale of each element's tile, ``[rows, in]`` (block form) or ``[rows, 1]``."""
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        if not self.block_size:
            return self.scales.expand(self.shape[0], 1)[rows]
        b = self.block_size
        tiles = self.scales.repeat_interleave(b, dim=0)[: self.shape[0]]
        return tiles[rows].repeat_interleave(b, dim=1)[:, : self.shape[1]]

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        return (self.data[rows].float() * self.row_scales(rows)).to(dtype)


def quantize_fp8(x: torch.Tensor, kind: str = "e4m3", per_tensor: bool = False,
                 block_size: int | None = None) -> Float8Tensor:
    """``x [out, in]`` as float8 with absmax scales per row, for the whole tensor, or per ``block_size`` square
    tile (each tile's maximum over the format's largest value)."""
    if x.dim() != 2:
        raise UnsupportedError(f"quantize_fp8 expects a 2-D tensor, got shape {tuple(x.shape)}")
    check_finite(x)
    dtype = fp8_dtype(kind)
    x = x.float()
    if block_size:
        out, n_in = x.shape
        b = block_size
        padded = torch.nn.functional.pad(x.abs(), (0, -n_in % b, 0, -out % b))
        amax = padded.view(padded.shape[0] // b, b, padded.shape[1] // b, b).amax(dim=(1, 3))
        scales = torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))
        q = Float8Tensor(torch.empty(0), scales, (out, n_in), b)
        return Float8Tensor((x / q.row_scales()).to(dtype), scales, (out, n_in), b)
    amax = x.abs().amax().reshape(1, 1) if per_tensor else x.abs().amax(dim=1, keepdim=True)
    scales = torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))
    return Float8Tensor((x / scales).to(dtype), scales, tuple(x.shape))
