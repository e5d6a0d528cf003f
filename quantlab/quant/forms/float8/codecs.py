"""How float8 weights are written to each export target: compressed-tensors ``float-quantized`` (``weight`` in
e4m3 and a float32 ``weight_scale`` per channel, tensor or square block, as llm-compressor's FP8 and FP8_BLOCK
schemes write it). e5m2 values have no compressed-tensors form and no ggml type."""
from __future__ import annotations

from typing import Any

import torch

from ...codecs import register_codec
from ...codecs.compressed_tensors import CompressedTensorsCodec
from ...tensors.base import Spec, WeightTensor
from .tensor import Float8Tensor


class FloatQuantized(CompressedTensorsCodec):
    def claims(self, spec: Spec) -> str | None:
        if spec["element"] != "e4m3":
            return "float8 e5m2 values: compressed-tensors' float-quantized weights are e4m3"
        return None

    def scheme(self, q: WeightTensor) -> dict[str, Any]:
        assert isinstance(q, Float8Tensor)
        weights: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                                   "dynamic": False, "actorder": None, "observer": "minmax"}
        if q.block_size:
            weights.update(strategy="block", block_structure=[q.block_size, q.block_size])
        else:
            weights["strategy"] = "tensor" if q.per_tensor else "channel"
        return {"format": "float-quantized", "weights": weights}

    def tensors(self, q: WeightTensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        assert isinstance(q, Float8Tensor)
        scale = q.scales.float().contiguous() if q.block_size else q.scales.float().reshape(1 if q.per_tensor else -1, 1)
        return {"weight": q.data.cpu(), "weight_scale": scale.cpu()}


register_codec("float8", FloatQuantized())
