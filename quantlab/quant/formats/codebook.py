"""NF4 and FP4 as weight formats: 4-bit codebook values in blocks with an absolute maximum each (bitsandbytes' storage)."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator
from torch import nn

from ..format import WEIGHT_FORMATS, QuantizedWeightFormat
from ..forms.codebook.tensor import BLOCK_SIZES, CodebookTensor, quantize_codebook
from ..linear import QuantizedLinear, linear_weight
from ..tensors.base import Spec


class CodebookFormat(QuantizedWeightFormat):
    """NF4 or FP4 weights in blocks, optionally with double-quantized block maxima; dequantize+matmul."""

    example_fields: ClassVar[dict[str, Any] | None] = {"codebook": "nf4", "double_quant": True}
    codebook: Literal["nf4", "fp4"]
    block_size: int = Field(64, description="weights per absolute maximum (32-4096, a power of two)")
    double_quant: bool = Field(False, description="store the block maxima in 8 bits (QLoRA's double quantization)")

    @field_validator("block_size")
    @classmethod
    def _block(cls, v: int) -> int:
        if v not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {v}")
        return v

    @property
    def scheme_label(self) -> str:
        parts = [self.codebook, f"b{self.block_size}"] + (["dq"] if self.double_quant else [])
        return "-".join(parts + self.compute_dtype_label())

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("codebook", {"codebook": self.codebook, "block_size": self.block_size}),)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return CodebookTensor.analytic_nbytes((out_features, in_features), self.block_size, self.double_quant)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        q = quantize_codebook(linear_weight(module), self.codebook, self.block_size, self.double_quant)
        return QuantizedLinear.from_linear(module, q, settings={"method": self.codebook})


WEIGHT_FORMATS.register("codebook", "4-bit codebook weights in blocks (bitsandbytes' NF4/FP4); fields: codebook, "
                        "block_size, double_quant, compute_dtype")(CodebookFormat)
WEIGHT_FORMATS.add("nf4", CodebookFormat, "NF4: 4-bit normal-quantile codebook, absmax per block of 64 (QLoRA)",
                   codebook="nf4")
WEIGHT_FORMATS.add("fp4", CodebookFormat, "FP4: 4-bit float (e2m1) codebook, absmax per block of 64", codebook="fp4")


def NF4(block_size: int = 64, double_quant: bool = False, **fields: Any) -> CodebookFormat:  # noqa: N802  (a config)
    """NF4 weights (QLoRA's normal-quantile codebook), the ``nf4`` preset: ``CodebookFormat(codebook="nf4", ...)``;
    ``fields``: ``compute_dtype``, ``include``, ``exclude``, ``overrides``."""
    return CodebookFormat(codebook="nf4", block_size=block_size, double_quant=double_quant, **fields)


def FP4(block_size: int = 64, double_quant: bool = False, **fields: Any) -> CodebookFormat:  # noqa: N802  (a config)
    """FP4 weights (a 1-2-1 float codebook), the ``fp4`` preset: ``CodebookFormat(codebook="fp4", ...)``."""
    return CodebookFormat(codebook="fp4", block_size=block_size, double_quant=double_quant, **fields)
