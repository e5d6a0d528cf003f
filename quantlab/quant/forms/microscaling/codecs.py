"""How the microscaling forms are written to each export target.

compressed-tensors: ``nvfp4-pack-quantized`` (``weight_packed`` uint8 two codes a byte, ``weight_scale`` e4m3,
``weight_global_scale`` float32), ``mxfp4-pack-quantized`` (``weight_packed``, ``weight_scale`` as e8m0 exponent
bytes) and ``mxfp8-quantized`` (``weight`` in e4m3, ``weight_scale`` exponent bytes), with the weight arguments of
its NVFP4A16 / MXFP4A16 / MXFP8A16 presets. The codes and scales are the ones measured, byte for byte (the
reference tests show they are compressed-tensors' own for the same weight with ``scale_rounding: round``).

GGUF: MXFP4 as ggml's ``MXFP4`` blocks (the e8m0 exponent byte, then 16 bytes holding element j in the low nibble
and j + 16 in the high one; ggml's values are the e2m1 ones doubled over a halved scale, the same numbers). NVFP4
single-level (``arithmetic: ggml``, the global scale 1) as ggml's ``NVFP4`` blocks of 64 (four e4m3 scale bytes, one
per 16, then per 16 the element j in the low nibble and j + 8 in the high one); two-level NVFP4 is refused (ggml's
has no global scale, so its scales would be rounded again), as is MXFP8 (no ggml type).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...codecs import register_codec
from ...codecs.compressed_tensors import CompressedTensorsCodec
from ...codecs.gguf import GGUFCodec
from ...tensors.base import Spec, WeightTensor
from .tensor import MX_BLOCK, NVFP4_BLOCK, MXTensor, NVFP4Tensor, unpack_nibbles

GGML_NVFP4_BLOCK = 64  # QK_NVFP4: four sub-blocks of 16, each with its e4m3 scale
LOADING = ("microscaling groups: transformers' compressed-tensors path decompresses them into bfloat16 on CPU; a "
           "float32 model loads with quantization_config=CompressedTensorsConfig(dequantize=True) (vLLM reads the "
           "compressed tensors as written)")


def _weights(bits: int, group: int, strategy: str, scale_dtype: str) -> dict[str, Any]:
    return {"num_bits": bits, "type": "float", "symmetric": True, "group_size": group, "strategy": strategy,
            "dynamic": False, "scale_dtype": scale_dtype}


class NVFP4PackQuantized(CompressedTensorsCodec):
    note = LOADING

    def scheme(self, q: WeightTensor) -> dict[str, Any]:
        return {"format": "nvfp4-pack-quantized",
                "weights": _weights(4, NVFP4_BLOCK, "tensor_group", "torch.float8_e4m3fn")}

    def tensors(self, q: WeightTensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        assert isinstance(q, NVFP4Tensor)
        return {"weight_packed": q.codes.contiguous().cpu(), "weight_scale": q.scales.contiguous().cpu(),
                "weight_global_scale": q.global_scale.float().reshape(1).cpu()}


class MXQuantized(CompressedTensorsCodec):
    note = LOADING

    def scheme(self, q: WeightTensor) -> dict[str, Any]:
        assert isinstance(q, MXTensor)
        if q.element == "e2m1":
            return {"format": "mxfp4-pack-quantized", "weights": _weights(4, MX_BLOCK, "group", "torch.uint8")}
        return {"format": "mxfp8-quantized", "weights": _weights(8, MX_BLOCK, "group", "torch.uint8")}

    def tensors(self, q: WeightTensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        assert isinstance(q, MXTensor)
        name = "weight_packed" if q.element == "e2m1" else "weight"
        return {name: q.codes.contiguous().cpu(), "weight_scale": q.scales.contiguous().cpu()}


class MXFP4Blocks(GGUFCodec):
    def claims(self, spec: Spec) -> str | None:
        return None if spec["element"] == "e2m1" else "MXFP8 (e4m3 elements) has no ggml type"

    def ggml_type(self, q: WeightTensor) -> str:
        return "MXFP4"

    def encode(self, q: WeightTensor, kind: str) -> np.ndarray:
        assert isinstance(q, MXTensor) and kind == "MXFP4"
        out, n_in = q.shape
        codes = unpack_nibbles(q.codes).reshape(out, n_in // MX_BLOCK, MX_BLOCK)
        packed = codes[..., :16] | (codes[..., 16:] << 4)
        blocks = torch.cat([q.scales.reshape(out, -1, 1), packed], dim=-1)
        return blocks.reshape(out, -1).contiguous().cpu().numpy()


class NVFP4Blocks(GGUFCodec):
    def claims(self, spec: Spec) -> str | None:
        if spec["global_scale"] != "one":
            return ("two-level NVFP4 has a float32 global scale; ggml's NVFP4 (blocks of 64, unsigned e4m3 scales, "
                    "none global) would round its scales again: quantize with nvfp4's arithmetic: ggml")
        if spec["in_features"] is not None and spec["in_features"] % GGML_NVFP4_BLOCK:
            return f"ggml's NVFP4 stores blocks of {GGML_NVFP4_BLOCK}; a row of {spec['in_features']} is not whole blocks"
        return None

    def ggml_type(self, q: WeightTensor) -> str:
        return "NVFP4"

    def encode(self, q: WeightTensor, kind: str) -> np.ndarray:
        assert isinstance(q, NVFP4Tensor) and kind == "NVFP4"
        out, n_in = q.shape
        codes = unpack_nibbles(q.codes).reshape(out, n_in // GGML_NVFP4_BLOCK, 4, NVFP4_BLOCK)
        packed = (codes[..., :8] | (codes[..., 8:] << 4)).reshape(out, -1, 32)
        scales = q.scales.view(torch.uint8).reshape(out, -1, 4)
        return torch.cat([scales, packed], dim=-1).reshape(out, -1).contiguous().cpu().numpy()


register_codec("nvfp4", NVFP4PackQuantized())
register_codec("mx", MXQuantized())
register_codec("mx", MXFP4Blocks())
register_codec("nvfp4", NVFP4Blocks())
