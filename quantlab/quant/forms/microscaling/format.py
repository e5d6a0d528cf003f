"""The microscaling weight formats of a recipe: ``mxfp4``, ``mxfp8`` and ``nvfp4`` (round to nearest into the forms
of ``tensor.py``; the scale and tie rules are fields whose defaults follow the references, see ``quantize.py``)."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from ...activations import ActivationFormat, rounding_module
from ...format import WEIGHT_FORMATS, QuantizedWeightFormat
from ...kernels.base import KernelName
from ...linear import QuantizedLinear, linear_weight
from ...tensors.base import Spec
from .quantize import Arithmetic, ScaleRounding, Ties, quantize_mx, quantize_nvfp4
from .tensor import MX_BLOCK, NVFP4_BLOCK, Element, MXTensor, NVFP4Tensor


class MicroscalingFormat(QuantizedWeightFormat):
    """Fields shared by the microscaling formats."""

    example_fields: ClassVar[dict[str, Any] | None] = {}
    block: ClassVar[int]
    kernel: KernelName = Field("auto", description="matmul path (a registered kernel); auto takes the fastest that "
                               "supports the form")
    activations: ActivationFormat | None = Field(None, description="round each quantized linear's input too: "
                                                 "NAME or {format: nvfp4 | mxfp4 | mxfp8 | fp8, group_size} "
                                                 "(W4A4, W8A8; emulated on CPU); null: weight-only")

    @property
    def kernels(self) -> list[str] | None:
        return None if self.kernel == "auto" else [self.kernel]

    def check_model(self, linears: dict[str, tuple[int, int]], head: str | None,
                    base: torch.dtype) -> tuple[str, str] | None:
        block = max(self.block, self.activations.block if self.activations else 1)
        for name, (out, n_in) in linears.items():
            if self.format_for(name) is self and n_in % block:
                return ".format", (f"{self.label} takes blocks of {block} along the input; {name} has {n_in} input "
                                   "features (exclude it, or give it another format in overrides)")
        return super().check_model(linears, head, base)

    def label_with(self, name: str, extra: list[str]) -> str:
        return "-".join([name, *extra, *([self.activations.label] if self.activations else []),
                         *self.compute_dtype_label(), *([self.kernel] if self.kernel != "auto" else [])])

    def quantized_linear(self, module: nn.Module, q: MXTensor | NVFP4Tensor) -> QuantizedLinear:
        """``module`` holding ``q``, rounding its input where ``activations`` says so."""
        return QuantizedLinear.from_linear(module, q, self.kernels, {"method": "rtn"}, rounding_module(self.activations))


class MXFormat(MicroscalingFormat):
    """OCP MX weights: elements with an e8m0 (power-of-two) scale per 32 weights of a row."""

    block: ClassVar[int] = MX_BLOCK
    element: ClassVar[Element]
    scale_rounding: ScaleRounding = Field(
        "floor", description="the power of two of each block: floor (OCP MX, torchao's default, ggml), round "
        "(compressed-tensors / llm-compressor: the block maximum rounded to e2m1's mantissa first), even "
        "(torchao's EVEN), ceil, rceil (cuBLAS's)")

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("mx", {"element": self.element}),)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return MXTensor.analytic_nbytes((out_features, in_features), self.element)


class MXFP4Format(MXFormat):
    element: ClassVar[Element] = "e2m1"
    ties: Ties = Field("even", description="an element halfway between two e2m1 values: even (OCP, torchao, "
                       "compressed-tensors) or to_zero (ggml's quantizer; zero then stored as +0)")

    @property
    def scheme_label(self) -> str:
        extra = [self.scale_rounding] if self.scale_rounding != "floor" else []
        return self.label_with("mxfp4", extra + (["tz"] if self.ties == "to_zero" else []))

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        return self.quantized_linear(module, quantize_mx(linear_weight(module), "e2m1", self.scale_rounding, self.ties))


class MXFP8Format(MXFormat):
    element: ClassVar[Element] = "e4m3"

    @property
    def scheme_label(self) -> str:
        return self.label_with("mxfp8", [self.scale_rounding] if self.scale_rounding != "floor" else [])

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        return self.quantized_linear(module, quantize_mx(linear_weight(module), "e4m3", self.scale_rounding))


class NVFP4Format(MicroscalingFormat):
    """NVFP4 weights: e2m1 elements, an e4m3 scale per 16 weights of a row, a float32 global scale per tensor."""

    block: ClassVar[int] = NVFP4_BLOCK
    arithmetic: Arithmetic = Field("divide", description="divide (compressed-tensors / llm-compressor, ModelOpt's "
                                   "rule) or reciprocal (torchao's nvfp4_quantize); they differ in the last bit of a "
                                   "few elements. ggml: ggml's quantize_row_nvfp4_ref, single-level (no global "
                                   "scale; scales rounded half up to unsigned e4m3; ties to the smaller element), "
                                   "the NVFP4 GGUF holds")

    @property
    def scheme_label(self) -> str:
        extra = {"reciprocal": ["recip"], "ggml": ["ggml"]}.get(self.arithmetic, [])
        return self.label_with("nvfp4", extra)

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("nvfp4", {"global_scale": "one" if self.arithmetic == "ggml" else "tensor"}),)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return NVFP4Tensor.analytic_nbytes((out_features, in_features))

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        return self.quantized_linear(module, quantize_nvfp4(linear_weight(module), arithmetic=self.arithmetic))


WEIGHT_FORMATS.register("mxfp4", "OCP MXFP4: e2m1 elements, an e8m0 scale per 32; fields: scale_rounding, ties, "
                        "activations, compute_dtype, kernel")(MXFP4Format)
WEIGHT_FORMATS.register("mxfp8", "OCP MXFP8: e4m3 elements, an e8m0 scale per 32; fields: scale_rounding, "
                        "activations, compute_dtype, kernel")(MXFP8Format)
WEIGHT_FORMATS.register("nvfp4", "NVFP4: e2m1 elements, an e4m3 scale per 16 and a float32 global scale (arithmetic: "
                        "ggml for ggml's single-level NVFP4, which GGUF holds); fields: arithmetic, activations, "
                        "compute_dtype, kernel")(NVFP4Format)
