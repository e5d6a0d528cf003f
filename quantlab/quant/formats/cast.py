"""Floating-point baselines as formats (fp32 / bf16 / fp16), so baselines take the same path as quantized variants."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..format import DTYPES, SHORT_DTYPE, WEIGHT_FORMATS, DtypeName, WeightFormat
from ..offload import cast_
from ..tensors.base import Spec


@WEIGHT_FORMATS.register("cast", "every tensor cast to a floating-point dtype (field: dtype)")
class CastFormat(WeightFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {"dtype": "bfloat16"}
    dtype: DtypeName

    @property
    def scheme_label(self) -> str:
        return SHORT_DTYPE[self.dtype]

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("dense", {"dtype": self.dtype}),)

    def prepare_model_(self, model: nn.Module) -> None:
        cast_(model, DTYPES[self.dtype])

    def unquantized_dtype(self, base: torch.dtype) -> torch.dtype:
        return DTYPES[self.dtype]

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return out_features * in_features * DTYPES[self.dtype].itemsize


WEIGHT_FORMATS.add("fp32", CastFormat, "float32 weights and activations", dtype="float32")
WEIGHT_FORMATS.add("bf16", CastFormat, "bfloat16 weights and activations", dtype="bfloat16")
WEIGHT_FORMATS.add("fp16", CastFormat, "float16 weights and activations", dtype="float16")
