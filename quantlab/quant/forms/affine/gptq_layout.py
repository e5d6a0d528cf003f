"""The GPTQ tensor layout of an integer affine weight (qweight / qzeros / scales / g_idx), to and from
``QuantizedTensor``: what the GPTQ checkpoint writer, the published-checkpoint format and GPTQModel's kernels
share.

Per quantized linear ``[out, in]`` with ``G`` groups: ``qweight`` int32 ``[in * bits / 32, out]`` (codes along the
input, low bits first), ``qzeros`` int32 ``[G, out * bits / 32]`` holding ``zero - 1`` (``gptq``, v1) or ``zero``
(``gptq_v2``), ``scales`` float16 ``[G, out]``, ``g_idx`` int32 ``[in]``.
"""
from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ...tensors.primitives import pack
from .tensor import QuantizedTensor

EXPORT_BITS = (2, 4, 8)


def pack_int32(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``[rows, n]`` codes along dim 0 into int32 words of ``32 / bits`` codes, low bits first."""
    per = 32 // bits
    c = codes.to(torch.int64).reshape(codes.shape[0] // per, per, -1)
    shifts = (torch.arange(per, dtype=torch.int64) * bits).view(1, per, 1)
    words = (c << shifts).sum(dim=1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)  # same bits, signed


def unpack_int32(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of ``pack_int32``: int32 words ``[rows / (32 / bits), n]`` back to uint8 codes ``[rows, n]``."""
    per = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(per, dtype=torch.int64) * bits).view(1, per, 1)
    return ((w.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1, words.shape[1]).to(torch.uint8)


FORMATS = ("gptq", "gptq_v2")


def to_gptq_tensors(q: QuantizedTensor, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """A QuantizedTensor as GPTQ tensors (``gptq``: v1, zeros stored minus one; ``gptq_v2``: as they are)."""
    if q.bits not in EXPORT_BITS:
        raise UnsupportedError(f"the GPTQ checkpoint format is written for bits {EXPORT_BITS}, not {q.bits}")
    if q.per_tensor:
        raise UnsupportedError("the GPTQ checkpoint format has no per-tensor scales")
    out, n_in = q.shape
    g_idx = q.g_idx if q.g_idx is not None else (
        torch.zeros(n_in, dtype=torch.int32) if q.group_size is None else (torch.arange(n_in) // q.group_size).to(torch.int32))
    zeros = q.row_zero_points().to(torch.int64)  # [out, G]
    v1 = checkpoint_format == "gptq"
    if v1 and (zeros == 0).any():
        raise UnsupportedError("a group has zero point 0, which GPTQ v1 (it stores zero - 1) cannot represent; "
                               "write checkpoint_format gptq_v2")
    return {
        "qweight": pack_int32(q.codes().t().contiguous(), q.bits),
        "qzeros": pack_int32(zeros - 1 if v1 else zeros, q.bits).t().contiguous(),
        "scales": q.scales.t().to(torch.float16).contiguous(),
        "g_idx": g_idx.to(torch.int32).cpu(),
    }


def from_gptq_tensors(
    t: dict[str, torch.Tensor], bits: int, group_size: int, sym: bool, checkpoint_format: str = "gptq"
) -> QuantizedTensor:
    """GPTQ tensors as a QuantizedTensor (``group_size = -1`` means per output channel)."""
    codes = unpack_int32(t["qweight"], bits).t().contiguous()  # [out, in]
    out, n_in = codes.shape
    stored = unpack_int32(t["qzeros"].t().contiguous(), bits).to(torch.int64)  # [out, G]
    zeros = (stored + 1) & ((1 << bits) - 1) if checkpoint_format == "gptq" else stored
    scales = t["scales"].t().contiguous()
    gs = None if group_size == -1 else group_size
    contiguous = torch.equal(t["g_idx"].long(), torch.zeros(n_in, dtype=torch.long) if gs is None else torch.arange(n_in) // gs)
    return QuantizedTensor(
        packed=pack(codes, bits), scales=scales, zeros=None if sym else pack(zeros.to(torch.uint8), bits),
        shape=(out, n_in), bits=bits, group_size=gs, g_idx=None if contiguous else t["g_idx"].to(torch.int32),
    )
