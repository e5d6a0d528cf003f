"""The integer affine stored form: packed codes with group-wise scales and zero points (``QuantizedTensor``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ....errors import UnsupportedError
from ...tensors.base import Spec, WeightTensor
from ...tensors.primitives import (
    ClipSearch,
    choose_qparams,
    dequantize_affine,
    pack,
    packed_row_bytes,
    quantize_affine,
    unpack,
)


@dataclass
class QuantizedTensor(WeightTensor):
    """A 2-D weight ``[out, in]`` stored as packed ``bits``-bit codes.

    ``group_size`` is the number of consecutive input columns sharing a scale
    (``None``: one group per output row). Symmetric tensors store no zeros.
    """

    packed: torch.Tensor  # uint8 [out, packed_row_bytes(in, bits)]
    scales: torch.Tensor  # [out, n_groups]
    zeros: torch.Tensor | None  # uint8 [out, packed_row_bytes(n_groups, bits)] or None (symmetric)
    shape: tuple[int, int]
    bits: int
    group_size: int | None
    g_idx: torch.Tensor | None = None  # int32 [in]: group of each input column (act-order); None = contiguous

    form = "affine"

    def spec(self) -> Spec:
        return Spec(self.form, {"bits": self.bits, "group_size": self.group_size, "symmetric": self.symmetric,
                                "per_tensor": self.per_tensor, "act_order": self.g_idx is not None})

    def describe(self) -> str:
        return f"{self.bits}-bit {'per channel' if self.group_size is None else f'group {self.group_size}'}"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("packed", "scales", "zeros", "g_idx")

    @property
    def n_groups(self) -> int:
        """Scale groups per row; when the group size does not divide the input, the last group is shorter."""
        return 1 if self.group_size is None else -(-self.shape[1] // self.group_size)

    @property
    def per_tensor(self) -> bool:
        """One scale (and zero) for the whole tensor."""
        return self.scales.shape[0] == 1 and self.shape[0] > 1

    def row_scales(self) -> torch.Tensor:
        """Scales as ``[out, n_groups]`` (a per-tensor scale repeated on every row)."""
        return self.scales.expand(self.shape[0], -1)

    def row_zero_points(self, rows: slice | None = None) -> torch.Tensor:
        """Zero points as ``[out, n_groups]`` (or those of ``rows``), built only for the rows asked for."""
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        if self.zeros is None:
            return torch.full_like(self.row_scales()[rows], 1 << (self.bits - 1), dtype=torch.uint8)
        if self.per_tensor:
            return self.zero_points().expand(self.shape[0], -1)[rows]
        return unpack(self.zeros[rows], self.bits, self.n_groups)

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    def layout_nbytes(self) -> int:
        return QuantizedTensor.analytic_nbytes(self.shape, self.bits, self.group_size, self.symmetric,
                                               self.scales.element_size(), self.g_idx is not None, self.per_tensor)

    def codes(self) -> torch.Tensor:
        return unpack(self.packed, self.bits, self.shape[1])

    def zero_points(self) -> torch.Tensor:
        if self.zeros is None:
            return torch.full(self.scales.shape, 1 << (self.bits - 1), dtype=torch.uint8, device=self.scales.device)
        return unpack(self.zeros, self.bits, self.n_groups)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        """The weight ``[out, in]`` as ``dtype``; ``rows`` selects a range of output rows."""
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        n_in = self.shape[1]
        codes = unpack(self.packed[rows], self.bits, n_in)
        scales, zeros = self.row_scales()[rows], self.row_zero_points(rows)
        if self.g_idx is not None:  # columns belong to groups out of order: gather per column
            g = self.g_idx.long()
            return dequantize_affine(codes.unsqueeze(-1), scales[:, g], zeros[:, g], dtype).squeeze(-1)
        n = codes.shape[0]
        q = padded_columns(codes, self.n_groups * (self.group_size or n_in)).reshape(n, self.n_groups, -1)
        return dequantize_affine(q, scales, zeros, dtype).reshape(n, -1)[:, :n_in]

    @staticmethod
    def analytic_nbytes(
        shape: tuple[int, int], bits: int, group_size: int | None, symmetric: bool, scale_bytes: int,
        act_order: bool = False, per_tensor: bool = False,
    ) -> int:
        """Bytes the format needs for ``shape``, from bits, group size and metadata alone."""
        out, n_in = shape
        groups = 1 if group_size is None else -(-n_in // group_size)
        param_rows = 1 if per_tensor else out
        zeros = 0 if symmetric else param_rows * packed_row_bytes(groups, bits)
        g_idx = 4 * n_in if act_order else 0
        return out * packed_row_bytes(n_in, bits) + param_rows * groups * scale_bytes + zeros + g_idx


def padded_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x [out, in]`` padded with zeros to ``width`` columns."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1])) if width > x.shape[1] else x


def quantize_tensor(
    x: torch.Tensor,
    bits: int,
    group_size: int | None = None,
    symmetric: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    per_tensor: bool = False,
    clip: ClipSearch | None = None,
) -> QuantizedTensor:
    """Affine round-to-nearest quantization of a 2-D tensor ``[out, in]``.

    Scales are per output channel (``group_size=None``), per group of ``group_size`` input columns,
    or one for the whole tensor (``per_tensor=True``). ``clip`` searches a narrower range per group.
    """
    if x.dim() != 2:
        raise UnsupportedError(f"quantize_tensor expects a 2-D tensor, got shape {tuple(x.shape)}")
    if not 1 <= bits <= 8:
        raise UnsupportedError(f"bits must be between 1 and 8, got {bits}")
    out, n_in = x.shape
    if group_size is not None and group_size <= 0:
        raise UnsupportedError(f"group size must be positive, got {group_size}")
    if per_tensor and group_size is not None:
        raise UnsupportedError("per_tensor and group_size exclude each other")
    n_groups = 1 if group_size is None else -(-n_in // group_size)
    # A shorter last group is padded with zeros, which never change its scale: ranges always include 0.
    groups = padded_columns(x, n_groups * (group_size or n_in)).reshape(1 if per_tensor else out, n_groups, -1)
    scale, zero = choose_qparams(groups, bits, symmetric, scale_dtype, clip)
    codes = quantize_affine(groups, scale, zero, bits).reshape(out, -1)[:, :n_in]
    return QuantizedTensor(
        packed=pack(codes, bits),
        scales=scale,
        zeros=None if symmetric else pack(zero, bits),
        shape=(out, n_in),
        bits=bits,
        group_size=group_size,
    )


def act_order_columns(q: QuantizedTensor) -> torch.Tensor | None:
    """For act-order tensors: input columns sorted by group, so each group is contiguous."""
    return None if q.g_idx is None else torch.argsort(q.g_idx.long(), stable=True).to(torch.int32)


def group_index(column_order: torch.Tensor | None, group: int) -> torch.Tensor | None:
    """Inverse of ``act_order_columns``: the group of each input column (``g_idx``) from the sorted order."""
    if column_order is None:
        return None
    g_idx = torch.empty_like(column_order)
    g_idx[column_order.long()] = (torch.arange(column_order.numel(), device=column_order.device) // group).to(g_idx.dtype)
    return g_idx
