"""Microscaling stored forms: small float elements sharing a scale per block of the input dimension.

- MX (OCP Microscaling v1.0): ``mxfp4`` (e2m1 elements) and ``mxfp8`` (e4m3 elements), one e8m0 scale (a power
  of two, stored as its biased exponent byte) per 32 weights of a row.
- NVFP4: e2m1 elements, one e4m3 scale per 16 weights of a row and one float32 global scale per tensor.

e2m1 codes are packed two to a byte, the even column in the low nibble (as compressed-tensors' and torchao's
packers and ggml store them); the sign is the code's bit 3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ...tensors.base import Spec, WeightTensor

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0-7; 8-15 are their negatives
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E8M0_BIAS = 127
MX_BLOCK = 32
NVFP4_BLOCK = 16
Element = Literal["e2m1", "e4m3"]


def e2m1_table(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 values of the e2m1 codes (sign in bit 3)."""
    values = torch.tensor(E2M1_VALUES, dtype=dtype, device=device)
    return torch.cat([values, -values])


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` codes 0-15 as ``[out, in / 2]`` bytes, the even column in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_nibbles``: ``[out, in]`` codes 0-15 (uint8)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def e8m0_to_float(exponents: torch.Tensor) -> torch.Tensor:
    """Biased e8m0 exponent bytes as float32 powers of two (255, e8m0's NaN, as NaN)."""
    e = exponents.to(torch.int32)
    value = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23).view(torch.float32)  # 0: 2^-127, subnormal
    return torch.where(e == 255, torch.full_like(value, float("nan")), value)


def _blocks(values: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """``values [out, in]`` times ``scales [out, in / block]`` broadcast along each block."""
    out, n_in = values.shape
    return (values.view(out, n_in // block, block) * scales.unsqueeze(-1)).view(out, n_in)


@dataclass
class MXTensor(WeightTensor):
    """OCP MX weights: ``codes`` (e2m1: uint8 ``[out, in / 2]``, two codes a byte; e4m3: float8_e4m3fn
    ``[out, in]``) and ``scales``, the biased e8m0 exponent (uint8) of each row's block of 32."""

    codes: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    element: Element = "e2m1"

    group_size = MX_BLOCK
    form = "mx"

    def spec(self) -> Spec:
        return Spec(self.form, {"element": self.element})

    def describe(self) -> str:
        return f"MX{'FP4' if self.element == 'e2m1' else 'FP8'} ({self.element}, e8m0 scale per {MX_BLOCK})"

    @property
    def bits(self) -> int:
        return 4 if self.element == "e2m1" else 8

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("codes", "scales")

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int], element: Element) -> int:
        out, n_in = shape
        return out * n_in * (4 if element == "e2m1" else 8) // 8 + out * (n_in // MX_BLOCK)

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape, self.element)

    def element_values(self, rows: slice | None = None) -> torch.Tensor:
        """The elements ``[out, in]`` as float32, before their scales."""
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        if self.element == "e2m1":
            return e2m1_table(device=self.codes.device)[unpack_nibbles(self.codes[rows]).long()]
        return self.codes[rows].float()

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        return _blocks(self.element_values(rows), e8m0_to_float(self.scales[rows]), MX_BLOCK).to(dtype)


@dataclass
class NVFP4Tensor(WeightTensor):
    """NVFP4 weights: e2m1 ``codes`` (uint8 ``[out, in / 2]``), ``scales`` (float8_e4m3fn ``[out, in / 16]``) and
    ``global_scale`` (float32 ``[1]``). A weight is ``value(code) * scale / global_scale``."""

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    shape: tuple[int, int]

    bits = 4
    group_size = NVFP4_BLOCK
    form = "nvfp4"

    def spec(self) -> Spec:
        single = bool((self.global_scale.float() == 1).all())
        return Spec(self.form, {"global_scale": "one" if single else "tensor", "in_features": self.shape[1]})

    def describe(self) -> str:
        return f"NVFP4 (e2m1, e4m3 scale per {NVFP4_BLOCK}, float32 global scale)"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("codes", "scales", "global_scale")

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int]) -> int:
        out, n_in = shape
        return out * n_in // 2 + out * (n_in // NVFP4_BLOCK) + 4

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        values = e2m1_table(device=self.codes.device)[unpack_nibbles(self.codes[rows]).long()]
        scales = self.scales[rows].float() / self.global_scale.float()
        return _blocks(values, scales, NVFP4_BLOCK).to(dtype)
