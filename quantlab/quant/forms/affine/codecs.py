"""How integer codes with zero points are written to each export target.

compressed-tensors ``pack-quantized``: ``weight_packed`` (int32, codes packed along the input by compressed-tensors'
own ``pack_to_int32``), ``weight_scale`` ``[out, groups]``, ``weight_zero_point`` (asymmetric, packed along the
output) and ``weight_shape``; ``(code − zero) · scale`` is compressed-tensors' ``(q − zp) · scale`` with
``q = code − 2^(bits−1)``. Act-order columns and one scale per tensor are not written.

GGUF: codes in blocks of 32 along the input (any group that is a multiple of 32, per channel included, since a
group's scale is then repeated in each of its blocks) as ggml's legacy types: symmetric 4-bit → Q4_0
(``d · (q − 8)``), 5-bit → Q5_0, 8-bit → Q8_0 (``d · (q − 128)``, int8), exactly, with ``d`` the group scale in
float16; asymmetric 4- and 5-bit (integer or float zero points) → Q4_1 / Q5_1 (``d · q + m``): the codes and ``d``
exactly, ``m = −z · d`` rounded to float16 (at most half a float16 ulp of ``m``; the manifest gives each tensor's
largest deviation).

GPTQ (bits 2, 4, 8, a scale per channel or group, act-order kept) and AWQ's GEMM layout (4-bit, groups dividing
the input in order, outputs a multiple of 8) take integer zero points; float zero points (HQQ's) are written to
any of these where every one is a whole number within the code range, and refused otherwise.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ...codecs import register_codec
from ...codecs.compressed_tensors import CompressedTensorsCodec
from ...codecs.gguf import BLOCK, GGUFCodec, f16_bytes
from ...codecs.integer import IntegerCodec
from ...tensors.base import Spec, WeightTensor
from ...tensors.primitives import pack
from .float_zero import FloatZeroTensor
from .gptq_layout import EXPORT_BITS
from .tensor import QuantizedTensor

# (bits, symmetric) -> ggml type name; float zero points are asymmetric.
BLOCK_TYPES = {(4, True): "Q4_0", (4, False): "Q4_1", (5, True): "Q5_0", (5, False): "Q5_1", (8, True): "Q8_0"}
FLOAT_ZEROS = "float zero points (zero_point: float, HQQ) are written only where every one is a whole number"


def whole_zero_form(q: FloatZeroTensor) -> QuantizedTensor | None:
    """``q`` with integer zero points where every float zero point is a whole number in the code range, else None."""
    z = q.zeros.float()
    if torch.equal(z, torch.round(z)) and bool(((z >= 0) & (z < (1 << q.bits))).all()):
        return QuantizedTensor(q.packed, q.scales, pack(z.to(torch.uint8), q.bits), q.shape, q.bits, q.group_size)
    return None


def _integer(q: WeightTensor) -> tuple[QuantizedTensor | None, str]:
    if isinstance(q, QuantizedTensor):
        return q, ""
    assert isinstance(q, FloatZeroTensor)
    found = whole_zero_form(q)
    return (found, "") if found is not None else (None, "float zero points that are not whole numbers (HQQ)")


def scale_cast_deviation(q: QuantizedTensor, dtype: torch.dtype) -> float:
    """Largest change to the weight from writing its scales as ``dtype`` (0 where the cast is exact)."""
    written = dataclasses.replace(q, scales=q.scales.to(dtype))
    return float((written.dequantize() - q.dequantize()).abs().max())


class _FloatZeros:
    """Float zero points: claimed by no config (HQQ's are fractional), written per tensor where they are whole."""

    def claims(self, spec: Spec) -> str | None:
        return FLOAT_ZEROS


class AffineCompressedTensors(CompressedTensorsCodec):
    def claims(self, spec: Spec) -> str | None:
        return self.rules(spec)

    def rules(self, spec: Spec) -> str | None:
        """Why pack-quantized cannot hold integer codes described by ``spec``, or None."""
        if spec["act_order"]:
            return "act-order columns (g_idx) are not written here (GPTQ with act_order: false exports)"
        if spec["per_tensor"]:
            return "one scale per tensor for integer codes is not written here"
        return None

    def refusal(self, q: WeightTensor) -> str | None:
        integer, why = _integer(q)
        return f"{why} have no compressed-tensors form" if integer is None else self.rules(integer.spec())

    def scheme(self, q: WeightTensor) -> dict[str, Any]:
        integer, _ = _integer(q)
        assert integer is not None
        return {"format": "pack-quantized", "weights": {
            "num_bits": integer.bits, "type": "int", "symmetric": integer.symmetric,
            "strategy": "channel" if integer.group_size is None else "group", "group_size": integer.group_size,
            "dynamic": False, "actorder": None, "observer": "minmax"}}

    def tensors(self, q: WeightTensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

        integer, _ = _integer(q)
        assert integer is not None
        offset = 1 << (integer.bits - 1)
        codes = (integer.codes().to(torch.int16) - offset).to(torch.int8).cpu()
        out = {"weight_packed": pack_to_int32(codes, integer.bits), "weight_shape": torch.tensor(list(integer.shape)),
               "weight_scale": integer.row_scales().to(dtype).contiguous().cpu()}
        if not integer.symmetric:
            zeros = (integer.row_zero_points().to(torch.int16) - offset).to(torch.int8).cpu()
            out["weight_zero_point"] = pack_to_int32(zeros.contiguous(), integer.bits, packed_dim=0)
        return out

    def deviation(self, q: WeightTensor, dtype: torch.dtype) -> float:
        integer, _ = _integer(q)
        assert integer is not None
        return scale_cast_deviation(integer, dtype)


class FloatZeroCompressedTensors(_FloatZeros, AffineCompressedTensors):
    pass


class IntegerBlocks(GGUFCodec):
    """Codes in blocks of 32 as Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0."""

    def claims(self, spec: Spec) -> str | None:
        symmetric = bool(spec["symmetric"])
        if (spec["bits"], symmetric) not in BLOCK_TYPES:
            return f"{spec['bits']}-bit {'symmetric' if symmetric else 'asymmetric'} codes have no ggml block type"
        if spec["act_order"] or spec["per_tensor"]:
            return "act-order columns (g_idx) or one scale per tensor have no ggml block type"
        group = spec["group_size"]
        if group is not None and group % BLOCK:
            return f"groups of {group} are not whole blocks of {BLOCK}"
        return None

    def refusal(self, q: WeightTensor) -> str | None:
        why = self.claims(q.spec())
        if why:
            return why
        group = q.group_size or q.shape[1]  # type: ignore[attr-defined]
        if q.shape[1] % BLOCK or group % BLOCK:
            return f"groups of {group} over {q.shape[1]} inputs are not whole blocks of {BLOCK}"
        return None

    def ggml_type(self, q: WeightTensor) -> str:
        return BLOCK_TYPES[(q.bits, bool(q.spec()["symmetric"]))]  # type: ignore[attr-defined]

    def encode(self, q: WeightTensor, kind: str) -> np.ndarray:
        assert isinstance(q, (QuantizedTensor, FloatZeroTensor))
        out, n_in = q.shape
        nb = n_in // BLOCK
        codes = q.codes().to(torch.int32).reshape(out, nb, BLOCK)
        group = q.group_size or n_in
        block_group = torch.arange(nb) * BLOCK // group
        scale = q.row_scales().float()[:, block_group]  # [out, nb]
        parts = [f16_bytes(scale)]
        if kind in ("Q4_1", "Q5_1"):
            zero = q.row_zero_points().float()[:, block_group]
            parts.append(f16_bytes(-zero * scale))
        if kind == "Q8_0":
            parts.append((codes - 128).to(torch.int8).view(torch.uint8))
        else:
            low = codes & 0xF
            if kind in ("Q5_0", "Q5_1"):
                high = (codes >> 4) & 1  # bit j: element j's fifth bit, little-endian uint32
                qh = (high << torch.arange(BLOCK, dtype=torch.int32)).sum(-1).to(torch.int64)
                parts.append(torch.stack([(qh >> (8 * i)) & 0xFF for i in range(4)], -1).to(torch.uint8))
            parts.append((low[..., :16] | (low[..., 16:] << 4)).to(torch.uint8))
        return torch.cat(parts, dim=-1).reshape(out, -1).numpy()


class _Layout(IntegerCodec):
    """An integer-code target's layout of the affine forms (float zero points where they are whole)."""

    layout_name: str

    def integer(self, q: WeightTensor) -> tuple[Any | None, str]:
        found, why = _integer(q)
        return found, f"{why} have no {self.layout_name} form"


class GPTQLayout(_Layout):
    """GPTQ's qweight / qzeros / scales / g_idx (``gptq_layout``)."""

    target = "gptq"
    layout_name = "GPTQ"

    def layout(self, spec: Spec) -> str | None:
        if spec["bits"] not in EXPORT_BITS:
            return f"{spec['bits']}-bit codes: the GPTQ layout is written for bits {EXPORT_BITS}"
        if spec["per_tensor"]:
            return "one scale per tensor: the GPTQ layout has a scale per channel or group"
        return None


class FloatZeroGPTQLayout(_FloatZeros, GPTQLayout):
    pass


class AWQLayout(_Layout):
    """AutoAWQ's GEMM qweight / qzeros / scales (``awq_layout``)."""

    target = "awq"
    layout_name = "AWQ"

    def layout(self, spec: Spec) -> str | None:
        if spec["bits"] != 4:
            return "AWQ's GEMM layout holds 4-bit integer codes with integer zero points"
        if spec["group_size"] is None or spec["act_order"] or spec["per_tensor"]:
            return "AWQ's GEMM layout needs groups that divide the input, in order"
        return None

    def shape(self, q: Any) -> str | None:
        if q.shape[1] % q.group_size:
            return "AWQ's GEMM layout needs groups that divide the input, in order"
        if q.shape[0] % 8:
            return f"AWQ packs eight output columns per word; {q.shape[0]} outputs are not a multiple of 8"
        return None


class FloatZeroAWQLayout(_FloatZeros, AWQLayout):
    pass


register_codec("affine", AffineCompressedTensors())
register_codec("float_zero", FloatZeroCompressedTensors())
register_codec("affine", IntegerBlocks())
register_codec("float_zero", IntegerBlocks())
register_codec("affine", GPTQLayout())
register_codec("float_zero", FloatZeroGPTQLayout())
register_codec("affine", AWQLayout())
register_codec("float_zero", FloatZeroAWQLayout())
