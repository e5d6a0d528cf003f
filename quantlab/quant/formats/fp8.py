"""FP8 weights (e4m3 or e5m2) with a float32 scale per output channel or per tensor.

Each weight is divided by its scale (the row's or the tensor's absolute maximum over the format's largest value,
so the maximum maps onto it) and cast to the float8 dtype, which rounds to nearest even: the numerics of a plain
``(w / scale).to(torch.float8_e4m3fn)``. On CPU matmuls multiply the stored bytes directly (``fp8_cpu``, weight
only); elsewhere they dequantize (float8 times scale) and use the dense matmul, or, named as
``kernel: fp8_scaled_mm_cuda`` on a GPU with FP8 tensor cores, ``torch._scaled_mm`` with the
activations cast to e4m3 per row (the W8A8 form of vLLM's and torchao's float8 rowwise; not chosen by ``auto``
because rounding the activations changes the numerics).
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from ..activations import ActivationFormat, rounding_module
from ..format import WEIGHT_FORMATS, QuantizedWeightFormat
from ..forms.float8.tensor import Float8Tensor, quantize_fp8
from ..linear import QuantizedLinear, linear_weight
from ..tensors.base import Spec


class FP8Format(QuantizedWeightFormat):
    """Linear weights stored as float8 with float32 scales; activations stay in the compute dtype."""

    kind: Literal["e4m3", "e5m2"] = Field("e4m3", description="e4m3 (more precision) or e5m2 (more range)")
    per_tensor: bool = Field(False, description="one scale for the whole weight instead of one per output channel")
    block_size: int | None = Field(None, gt=0, description="one scale per block_size x block_size tile of the "
                                   "weight (128: DeepSeek-V3's and compressed-tensors' FP8_BLOCK; kernel fp8_block_cpu on CPU)")
    activations: ActivationFormat | None = Field(None, description="round each quantized linear's input too (W8A8): "
                                                 "fp8 (per token, or {format: fp8, group_size: 128}) or another "
                                                 "format; emulated on CPU; null: weight-only")
    kernel: Literal["auto", "fp8_cpu", "fp8_block_cpu", "dequantize+matmul", "fp8_scaled_mm_cuda"] = Field(
        "auto", description="fp8_scaled_mm_cuda: torch._scaled_mm with activations cast to e4m3 per row (CUDA, "
        "compute capability 8.9+, bf16); auto: fp8_cpu (fp8_block_cpu for blocks) on CPU (the stored bytes, weight only), else "
        "dequantize+matmul")

    @model_validator(mode="after")
    def _block(self) -> "FP8Format":
        if self.block_size and self.per_tensor:
            raise ValueError("block_size excludes per_tensor: true; drop one")
        if self.block_size and self.kernel not in ("auto", "dequantize+matmul", "fp8_block_cpu"):
            raise ValueError(f"kernel {self.kernel} takes a scale per channel or tensor; block_size runs on "
                             "fp8_block_cpu or dequantize+matmul")
        return self

    @property
    def scheme_label(self) -> str:
        parts = ["fp8", self.kind, f"b{self.block_size}" if self.block_size else "pt" if self.per_tensor else "pc"]
        parts += [self.activations.label] if self.activations else []
        return "-".join(parts + self.compute_dtype_label() + ([self.kernel] if self.kernel != "auto" else []))

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("float8", {"element": self.kind, "per_tensor": self.per_tensor, "block_size": self.block_size}),)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return Float8Tensor.analytic_nbytes((out_features, in_features), self.per_tensor, self.block_size)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        q = quantize_fp8(linear_weight(module), self.kind, self.per_tensor, self.block_size)
        kernels = None if self.kernel == "auto" else [self.kernel]
        return QuantizedLinear.from_linear(module, q, kernels, {"method": f"fp8-{self.kind}"},
                                           rounding_module(self.activations))

    def check_model(self, linears: dict[str, tuple[int, int]], head: str | None,
                    base: torch.dtype) -> tuple[str, str] | None:
        block = self.activations.block if self.activations else 1
        for name, (out, n_in) in linears.items():
            if self.format_for(name) is self and n_in % block:
                return ".activations", (f"{self.activations.label} takes blocks of {block} along the input; {name} has "
                                        f"{n_in} input features")
        return super().check_model(linears, head, base)


WEIGHT_FORMATS.register("fp8", "FP8 weights with a scale per output channel or tensor; fields: kind (e4m3 | e5m2), "
                        "per_tensor, compute_dtype, kernel")(FP8Format)
