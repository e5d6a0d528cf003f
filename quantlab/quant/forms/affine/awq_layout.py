"""AutoAWQ's GEMM tensor layout of a 4-bit integer affine weight, to and from ``QuantizedTensor``: what the
published-checkpoint reader and the AWQ exporter share.

``qweight`` int32 ``[in, out * bits / 32]`` packing eight output columns per word in the order 0 2 4 6 1 3 5 7
(low bits first), ``qzeros`` likewise per group ``[groups, out * bits / 32]``, ``scales`` ``[groups, out]``;
``(q - zero) · scale``.
"""
from __future__ import annotations

import torch

from ...tensors.primitives import pack
from .tensor import QuantizedTensor

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column of each 4-bit field of an AWQ GEMM word, low bits first


def pack_awq(codes: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Codes ``[rows, cols]`` as AWQ GEMM int32 words ``[rows, cols * bits / 32]`` (the inverse of ``unpack_awq``)."""
    per = 32 // bits
    rows, cols = codes.shape
    fields = codes.to(torch.int64).reshape(rows, cols // per, per)[..., list(AWQ_ORDER)]
    words = sum(fields[..., i] << (i * bits) for i in range(per))
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack_awq(words: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ GEMM int32 words ``[rows, cols * bits / 32]`` as codes ``[rows, cols]``."""
    per = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    fields = torch.stack([(w >> (i * bits)) & ((1 << bits) - 1) for i in range(per)], dim=-1)  # [rows, words, per]
    codes = torch.empty_like(fields)
    codes[..., list(AWQ_ORDER)] = fields
    return codes.reshape(words.shape[0], -1).to(torch.uint8)


def from_awq_tensors(t: dict[str, torch.Tensor], bits: int, group_size: int | None) -> QuantizedTensor:
    """AutoAWQ GEMM tensors as a QuantizedTensor."""
    codes = unpack_awq(t["qweight"], bits).t().contiguous()  # [out, in]
    out, n_in = codes.shape
    zeros = unpack_awq(t["qzeros"], bits).t().contiguous()  # [out, groups]
    return QuantizedTensor(packed=pack(codes, bits), scales=t["scales"].t().contiguous(), zeros=pack(zeros, bits),
                           shape=(out, n_in), bits=bits, group_size=group_size)


