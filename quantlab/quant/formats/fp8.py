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
from pydantic import Field
from torch import nn

from ..format import WEIGHT_FORMATS, QuantizedWeightFormat
from ..linear import QuantizedLinear, linear_weight
from ..tensors.float8 import Float8Tensor, quantize_fp8


class FP8Format(QuantizedWeightFormat):
    """Linear weights stored as float8 with float32 scales; activations stay in the compute dtype."""

    kind: Literal["e4m3", "e5m2"] = Field("e4m3", description="e4m3 (more precision) or e5m2 (more range)")
    per_tensor: bool = Field(False, description="one scale for the whole weight instead of one per output channel")
    kernel: Literal["auto", "fp8_cpu", "dequantize+matmul", "fp8_scaled_mm_cuda"] = Field(
        "auto", description="fp8_scaled_mm_cuda: torch._scaled_mm with activations cast to e4m3 per row (CUDA, "
        "compute capability 8.9+, bf16); auto: fp8_cpu on CPU (the stored bytes, weight only), else "
        "dequantize+matmul")

    @property
    def scheme_label(self) -> str:
        parts = ["fp8", self.kind, "pt" if self.per_tensor else "pc"]
        return "-".join(parts + self.compute_dtype_label() + ([self.kernel] if self.kernel != "auto" else []))

    @property
    def exports(self) -> tuple[str, ...]:
        """compressed-tensors' float-quantized weights are e4m3 with a scale per channel or tensor."""
        return ("compressed-tensors",) if self.kind == "e4m3" and not self.overrides else ()

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return Float8Tensor.analytic_nbytes((out_features, in_features), self.per_tensor)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        q = quantize_fp8(linear_weight(module), self.kind, self.per_tensor)
        kernels = None if self.kernel == "auto" else [self.kernel]
        return QuantizedLinear.from_linear(module, q, kernels, {"method": f"fp8-{self.kind}"})


WEIGHT_FORMATS.register("fp8", "FP8 weights with a scale per output channel or tensor; fields: kind (e4m3 | e5m2), "
                        "per_tensor, compute_dtype, kernel")(FP8Format)
