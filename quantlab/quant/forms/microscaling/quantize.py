"""Rounding a float weight into the microscaling forms.

MX scales are powers of two derived from each block's absolute maximum ``amax``; the choices the references make:

- ``floor`` (OCP MX v1.0 section 6.3, torchao's default ``FLOOR``, ggml's ``MXFP4``): ``2^(floor(log2 amax) - emax)``,
  ``emax`` the element's largest exponent (2 for e2m1, 8 for e4m3); values beyond the element's range saturate.
- ``round`` (compressed-tensors' ``generate_mx_scales``, so llm-compressor's checkpoints): ``amax`` first rounded to
  e2m1's one mantissa bit (for mxfp8 too), so a block whose maximum would saturate takes the next power of two.
- ``even`` (torchao's ``EVEN``): the same, rounded to the element's own mantissa width.
- ``ceil`` (torchao's ``CEIL``): the next power of two whenever ``amax`` has a mantissa.
- ``rceil`` (torchao's ``RCEIL``, cuBLAS's MX block quantization): ``2^ceil(log2(amax / element max))``.

Elements round to nearest, ties to even, and saturate at the element's largest value. NVFP4 follows
compressed-tensors' and ModelOpt's two-level rule: a float32 global scale ``448 * 6 / amax(tensor)``, each block's
e4m3 scale ``global * amax(block) / 6`` rounded to e4m3, the elements ``x / (scale / global)``.
"""
from __future__ import annotations

from typing import Literal

import torch

from ....errors import UnsupportedError
from ...tensors.primitives import check_finite
from .tensor import (
    E2M1_MAX,
    E4M3_MAX,
    E8M0_BIAS,
    MX_BLOCK,
    NVFP4_BLOCK,
    Element,
    MXTensor,
    NVFP4Tensor,
    e8m0_to_float,
    pack_nibbles,
)

ScaleRounding = Literal["floor", "round", "even", "ceil", "rceil"]
Ties = Literal["even", "to_zero"]
Arithmetic = Literal["divide", "reciprocal", "ggml"]
ZERO_BLOCK_SCALE = 0.125  # an all-zero NVFP4 block's scale (compressed-tensors' e4m3 eps), never a division by 0
ELEMENT_EMAX = {"e2m1": 2, "e4m3": 8}  # the largest exponent of the element format: floor(log2(max))
ELEMENT_MANTISSA = {"e2m1": 1, "e4m3": 3}
ELEMENT_MAX = {"e2m1": E2M1_MAX, "e4m3": E4M3_MAX}
E2M1_TIES_UP = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # boundaries between e2m1 values; at a boundary the
E2M1_TIE_TO_UPPER = (False, True, False, True, False, True, False)  # tie goes to the value with an even code


def e2m1_codes(x: torch.Tensor, ties: Ties = "even") -> torch.Tensor:
    """``x`` (already divided by its scale) as e2m1 codes 0-15, the nearest value, saturating at 6.

    ``ties: even`` (OCP, torchao, compressed-tensors): a tie goes to the even code and the sign bit is ``signbit``'s
    (a negative value that rounds to zero is stored as -0). ``ties: to_zero`` (ggml's quantizer, the first
    nearest of its table): a tie goes to the smaller magnitude and zero is stored as +0."""
    a = x.abs()
    index = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for boundary, upper in zip(E2M1_TIES_UP, E2M1_TIE_TO_UPPER):
        index += (a >= boundary if upper and ties == "even" else a > boundary).to(torch.uint8)
    negative = torch.signbit(x) if ties == "even" else (x < 0) & (index > 0)
    return index | (negative.to(torch.uint8) << 3)


def _check(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.dim() != 2:
        raise UnsupportedError(f"microscaling forms take a 2-D weight, got shape {tuple(x.shape)}")
    if x.shape[1] % block:
        raise UnsupportedError(f"microscaling blocks of {block} need in_features divisible by {block}, got {x.shape[1]}")
    check_finite(x)
    return x.float().contiguous()


def mx_scale_exponents(amax: torch.Tensor, element: Element, rounding: ScaleRounding) -> torch.Tensor:
    """The biased e8m0 exponent (uint8) of each block's scale from its absolute maximum (float32)."""
    amax = amax.float()
    emax, element_max = ELEMENT_EMAX[element], ELEMENT_MAX[element]
    if rounding == "rceil":
        exponent = torch.ceil(torch.log2(amax / element_max)).clamp(-E8M0_BIAS, E8M0_BIAS)
        return torch.where(amax > 0, exponent + E8M0_BIAS, torch.zeros_like(amax)).to(torch.uint8)
    bits = amax.view(torch.int32)
    if rounding in ("round", "even"):
        mantissa = ELEMENT_MANTISSA["e2m1" if rounding == "round" else element]
        bits = (bits + (1 << (23 - mantissa - 1))) & (0x1FF << 23)
    unbiased = ((bits >> 23) & 0xFF) - 127
    if rounding == "ceil":
        unbiased = unbiased + ((bits & 0x7FFFFF) > 0).to(unbiased.dtype)
    return (unbiased - emax).clamp(-E8M0_BIAS, E8M0_BIAS + 1).add(E8M0_BIAS).to(torch.uint8)


def quantize_mx(x: torch.Tensor, element: Element = "e2m1", rounding: ScaleRounding = "floor",
                ties: Ties = "even") -> MXTensor:
    """``x [out, in]`` as MX blocks of 32 along the input: e8m0 scales, e2m1 or e4m3 elements (e4m3 rounds to nearest
    even as torch's cast does; ``ties`` applies to e2m1)."""
    x = _check(x, MX_BLOCK)
    out, n_in = x.shape
    blocks = x.view(out, n_in // MX_BLOCK, MX_BLOCK)
    scales = mx_scale_exponents(blocks.abs().amax(-1), element, rounding)
    scale = e8m0_to_float(scales).clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(-1)
    limit = ELEMENT_MAX[element]
    scaled = (blocks / scale).clamp(-limit, limit).view(out, n_in)
    codes = pack_nibbles(e2m1_codes(scaled, ties)) if element == "e2m1" else scaled.to(torch.float8_e4m3fn)
    return MXTensor(codes, scales, (out, n_in), element)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The float32 global scale ``448 * 6 / amax`` (1 where the tensor is all zeros), shape ``[1]``."""
    amax = x.float().abs().amax().clamp(min=torch.finfo(torch.float32).tiny)
    scale = torch.nan_to_num(E4M3_MAX * E2M1_MAX / amax, nan=1.0, posinf=1.0, neginf=1.0)
    return scale.reshape(1)


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None = None,
                   arithmetic: Arithmetic = "divide") -> NVFP4Tensor:
    """``x [out, in]`` as NVFP4: e2m1 elements in blocks of 16, e4m3 block scales, a float32 global scale (the
    tensor's own by default).

    ``arithmetic: divide`` is compressed-tensors' (and so llm-compressor's): block scale ``global * amax / 6``, an
    all-zero block's scale 0.125, elements ``x / (scale / global)``. ``reciprocal`` is torchao's ``nvfp4_quantize``
    with a per-tensor scale ``amax / (448 * 6)``: block scale ``(amax / 6) / per_tensor`` clamped to e4m3's
    smallest normal, elements ``x * ((1 / per_tensor) / scale)``; the two differ in the last bit of a few elements
    (a handful per million on SmolLM2-135M). The stored global scale is ``448 * 6 / amax`` in both."""
    x = _check(x, NVFP4_BLOCK)
    if arithmetic == "ggml":
        return quantize_nvfp4_ggml(x)
    out, n_in = x.shape
    gs = nvfp4_global_scale(x) if global_scale is None else global_scale.float().reshape(1)
    blocks = x.view(out, n_in // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = blocks.abs().amax(-1)
    if arithmetic == "divide":
        rounded = (gs * (block_amax / E2M1_MAX)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
        # the zero block's scale chosen in float32 (exact in e4m3): inductor cannot select between float8 tensors
        fp8 = torch.where(rounded == 0, ZERO_BLOCK_SCALE, rounded).to(torch.float8_e4m3fn)
        scaled = blocks / (fp8.float() / gs).unsqueeze(-1)
    else:
        per_tensor = (1.0 / gs) if global_scale is not None else x.abs().amax().reshape(1) / (E4M3_MAX * E2M1_MAX)
        tiny = torch.finfo(torch.float8_e4m3fn).tiny
        fp8 = ((block_amax / E2M1_MAX) / per_tensor).clamp(tiny, E4M3_MAX).to(torch.float8_e4m3fn)
        scaled = blocks * ((1.0 / per_tensor) / fp8.float()).unsqueeze(-1)
    scaled = scaled.clamp(-E2M1_MAX, E2M1_MAX).view(out, n_in)
    return NVFP4Tensor(pack_nibbles(e2m1_codes(scaled)), fp8, gs, (out, n_in))


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # by code


def ggml_ue4m3(x: torch.Tensor) -> torch.Tensor:
    """Non-negative float32 ``x`` as the unsigned e4m3 bytes ggml's ``ggml_fp32_to_ue4m3`` writes: the fourth
    mantissa bit rounds half up, a value of 256 or more is 448 (0x7E), subnormals ``(int)(x * 512 + 0.5)``."""
    x = x.float().clamp(max=E4M3_MAX)
    bits = x.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127 + 7
    mantissa = ((bits >> 20) & 0x7) + ((bits >> 19) & 1)
    carry = mantissa > 7
    exponent, mantissa = torch.where(carry, exponent + 1, exponent), torch.where(carry, 0, mantissa)
    normal = torch.where(exponent >= 15, 0x7E, (exponent.clamp(0, 15) << 3) | mantissa)
    sub = (x * 512.0 + 0.5).to(torch.int32).clamp(max=7)
    code = torch.where(((bits >> 23) & 0xFF) - 127 + 7 <= 0, sub, normal)
    return torch.where(x > 0, code, 0).to(torch.uint8)


def quantize_nvfp4_ggml(x: torch.Tensor, rows_at_once: int = 2048) -> NVFP4Tensor:
    """``x [out, in]`` as ggml's ``quantize_row_nvfp4_ref`` rounds it (GGUF's NVFP4): single-level, the global
    scale 1; each block of 16 scaled by ``amax / 6`` in ggml's unsigned e4m3 (``ggml_ue4m3``), each element the
    e2m1 value nearest to it under that scale, the first in code order on a tie (the smaller magnitude)."""
    out, n_in = x.shape
    values = torch.tensor(E2M1_VALUES, device=x.device)
    codes, scales = [], []
    for start in range(0, out, rows_at_once):
        blocks = x[start: start + rows_at_once].reshape(-1, n_in // NVFP4_BLOCK, NVFP4_BLOCK)
        ue = ggml_ue4m3(blocks.abs().amax(-1) / E2M1_MAX)
        d = ue.view(torch.float8_e4m3fn).float().unsqueeze(-1)
        error = (values * d.unsqueeze(-1) - blocks.unsqueeze(-1)).abs()  # [rows, blocks, 16, 16 codes]
        codes.append(error.argmin(-1).reshape(-1, n_in))
        scales.append(ue.view(torch.float8_e4m3fn))
    return NVFP4Tensor(pack_nibbles(torch.cat(codes)), torch.cat(scales), torch.ones(1, device=x.device), (out, n_in))
