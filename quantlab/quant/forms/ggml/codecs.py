"""How ggml blocks are written to each export target: GGUF, as the blocks held (byte for byte, whatever the type)."""
from __future__ import annotations

import numpy as np

from ...codecs import register_codec
from ...codecs.gguf import GGUFCodec
from ...tensors.base import WeightTensor
from .tensor import GGMLBlockTensor


class HeldBlocks(GGUFCodec):
    exact = True

    def ggml_type(self, q: WeightTensor) -> str:
        assert isinstance(q, GGMLBlockTensor)
        return q.ggml_type

    def encode(self, q: WeightTensor, kind: str) -> np.ndarray:
        assert isinstance(q, GGMLBlockTensor)
        return q.blocks.cpu().contiguous().numpy()


register_codec("ggml", HeldBlocks())
