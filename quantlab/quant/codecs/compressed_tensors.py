"""The codec interface of the compressed-tensors target (``quant/io/compressed_tensors.py``)."""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..tensors.base import Spec, WeightTensor
from .base import Codec, register_codec


class CompressedTensorsCodec(Codec):
    """A stored form written as compressed-tensors: its config group's scheme and its tensors."""

    target: ClassVar[str] = "compressed-tensors"

    def scheme(self, q: WeightTensor) -> dict[str, Any]:
        """``{"format": ..., "weights": {...}}``: the config group ``q`` belongs to."""
        raise NotImplementedError

    def tensors(self, q: WeightTensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The module's tensors by their compressed-tensors names (scales in the model's ``dtype`` where the form
        leaves that open)."""
        raise NotImplementedError

    def deviation(self, q: WeightTensor, dtype: torch.dtype) -> float:
        """Largest change to the weight from writing it (0: the same numbers)."""
        return 0.0


class DenseCodec(CompressedTensorsCodec):
    """Weights left in floating point (``fp32``/``bf16``/``fp16``, a mix's unquantized layers): compressed-tensors
    lists such linears in ``ignore`` and the exporter writes them with the model's other tensors."""

    def claims(self, spec: Spec) -> str | None:
        dtype = spec["dtype"]
        return None if dtype in ("float32", "float16", "bfloat16") else f"{dtype} weights are no transformers dtype"


register_codec("dense", DenseCodec())
