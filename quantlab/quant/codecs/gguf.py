"""The codec interface of the GGUF target (``quant/io/gguf.py``), and the codec of weights kept in floating point."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from ..tensors.base import Spec, WeightTensor
from .base import Codec, register_codec

BLOCK = 32  # elements per block of ggml's legacy types


class GGUFCodec(Codec):
    """A stored form written as ggml blocks: its ggml type and its blocks."""

    target: ClassVar[str] = "gguf"
    exact: ClassVar[bool] = False  # the blocks are the held bytes: no deviation to compute

    def ggml_type(self, q: WeightTensor) -> str:
        """The ggml type ``q`` is written as (only asked of tensors ``refusal`` let through)."""
        raise NotImplementedError

    def encode(self, q: WeightTensor, kind: str) -> np.ndarray:
        """The tensor's blocks of type ``kind``: uint8 ``[out, in / block · block bytes]``, as ggml's structs."""
        raise NotImplementedError


def f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """``x [..]`` as float16 bytes ``[.., 2]`` (little-endian), as ggml's blocks hold their scales."""
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(*x.shape, 2)


class DenseCodec(GGUFCodec):
    """Weights left in floating point (a format that casts, ``fp32``/``bf16``/``fp16``): GGUF holds F32, F16 and
    BF16 tensors as they are. The exporter writes them with the model's other tensors."""

    def claims(self, spec: Spec) -> str | None:
        dtype = spec["dtype"]
        return None if dtype in ("float32", "float16", "bfloat16") else f"{dtype} weights have no ggml type"


register_codec("dense", DenseCodec())
