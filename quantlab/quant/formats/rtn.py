"""Affine round-to-nearest weight quantization (per output channel or in groups along the input)."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from ..activations import ActivationFormat, rounding_module
from ..format import DTYPES, WEIGHT_FORMATS, DtypeName, QuantizedWeightFormat
from ..forms.affine.float_zero import FloatZeroTensor, quantize_float_zero
from ..forms.affine.tensor import QuantizedTensor, quantize_tensor
from ..kernels.base import KernelName
from ..linear import QuantizedLinear, linear_weight
from ..tensors.base import Spec
from ..tensors.primitives import ClipSearch


class AffineFormat(QuantizedWeightFormat):
    """Fields shared by integer affine formats."""

    bits: int = Field(ge=2, le=8)
    group_size: int | None = Field(default=None, gt=0, description="input columns per scale; null = per output channel")
    symmetric: bool = False
    per_tensor: bool = Field(False, description="one scale for the whole tensor (excludes group_size)")
    clip: Literal["none", "mse"] = Field("none", description="mse: search a narrower range per group (grid 100, shrink <= 0.8, norm 2.4)")
    scale_dtype: DtypeName = "float16"
    zero_point: Literal["int", "float"] = Field("int", description="float: each group's exact range with an unrounded "
                                                "zero point (quanto's and HQQ's form; dequantize+matmul)")
    kernel: KernelName = Field("auto", description="matmul path (a registered kernel); auto takes the fastest "
                               "that supports the tensor")

    @property
    def kernels(self) -> list[str] | None:
        return None if self.kernel == "auto" else [self.kernel]

    @model_validator(mode="after")
    def _granularity(self) -> "AffineFormat":
        if self.group_size is not None and self.group_size & (self.group_size - 1):
            raise ValueError(f"group_size must be a power of two (e.g. 32, 64, 128), got {self.group_size}")
        if self.per_tensor and self.group_size is not None:
            raise ValueError("per_tensor: true excludes group_size; drop one")
        if self.zero_point == "float" and (self.symmetric or self.per_tensor or self.clip != "none"):
            raise ValueError("zero_point: float is for asymmetric groups or channels, without clip search")
        return self

    @property
    def clip_search(self) -> ClipSearch | None:
        return ClipSearch() if self.clip == "mse" else None

    @property
    def scheme_label(self) -> str:
        granularity = "pt" if self.per_tensor else "pc" if self.group_size is None else f"g{self.group_size}"
        parts = [f"int{self.bits}", granularity, "sym" if self.symmetric else "asym"]
        if self.zero_point == "float":
            parts.append("fz")
        if self.clip != "none":
            parts.append(self.clip)
        activations = getattr(self, "activations", None)
        parts += [activations.label] if activations else []
        parts += self.compute_dtype_label()
        if self.kernel != "auto":
            parts.append(self.kernel)
        return "-".join(parts)

    def check_model(self, linears: dict[str, tuple[int, int]], head: str | None,
                    base: torch.dtype) -> tuple[str, str] | None:
        activations = getattr(self, "activations", None)
        block = activations.block if activations else 1
        for name, (out, n_in) in linears.items():
            if self.format_for(name) is self and n_in % block:
                return ".activations", (f"{activations.label} takes blocks of {block} along the input; {name} has "
                                        f"{n_in} input features")
        return super().check_model(linears, head, base)

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("float_zero" if self.zero_point == "float" else "affine",
                     {"bits": self.bits, "group_size": self.group_size, "symmetric": self.symmetric,
                      "per_tensor": self.per_tensor, "act_order": self.stores_group_index}),)

    @property
    def stores_group_index(self) -> bool:
        """Whether each weight keeps a per-column group index (g_idx); GPTQ's act-order does."""
        return False

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        """The generic packed layout: codes, scales, zero points (asymmetric), group indices (act-order)."""
        if self.zero_point == "float":
            return FloatZeroTensor.analytic_nbytes((out_features, in_features), self.bits, self.group_size,
                                                   DTYPES[self.scale_dtype].itemsize)
        return QuantizedTensor.analytic_nbytes((out_features, in_features), self.bits, self.group_size, self.symmetric,
                                               DTYPES[self.scale_dtype].itemsize, self.stores_group_index,
                                               self.per_tensor)


ACTIVATIONS_FIELD = Field(None, description="round each quantized linear's input too: int8 (W8A8, W4A8: per token, "
                          "or {format: int8, global_scale: static}; an integer product on CPU, int8_act_cpu) or "
                          "another activation format (emulated); null: weight-only")


@WEIGHT_FORMATS.register("rtn", "affine round-to-nearest; fields: bits, group_size | per_tensor, symmetric, clip, "
                         "scale_dtype, zero_point, activations, kernel")
class RTNFormat(AffineFormat):
    activations: ActivationFormat | None = ACTIVATIONS_FIELD
    example_fields: ClassVar[dict[str, Any] | None] = {"bits": 4, "group_size": 32, "kernel": "dequantize+matmul"}
    solves_zero_points: ClassVar[bool] = False  # float zero points refined by HQQ's solve (the hqq format)

    @property
    def rounds_zero_points(self) -> bool:
        """Whether float zero points start from a rounded code (hqq's ``round_zero``)."""
        return False

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        if self.zero_point == "float":
            q = quantize_float_zero(linear_weight(module), self.bits, self.group_size, self.solves_zero_points,
                                    DTYPES[self.scale_dtype], self.rounds_zero_points)
            method = "hqq" if self.solves_zero_points else "rtn"
            return QuantizedLinear.from_linear(module, q, self.kernels, {"method": method},
                                               rounding_module(self.activations))
        q = quantize_tensor(linear_weight(module), self.bits, self.group_size, self.symmetric, DTYPES[self.scale_dtype],
                            self.per_tensor, self.clip_search)
        return QuantizedLinear.from_linear(module, q, self.kernels, input_rounding=rounding_module(self.activations))


WEIGHT_FORMATS.add("int8", RTNFormat, "8-bit affine round-to-nearest, per output channel", bits=8)
WEIGHT_FORMATS.add("int4", RTNFormat, "4-bit affine round-to-nearest; set group_size (e.g. 128)", bits=4)
WEIGHT_FORMATS.add("int3", RTNFormat, "3-bit affine round-to-nearest; set group_size (e.g. 128)", bits=3)
WEIGHT_FORMATS.add("int2", RTNFormat, "2-bit affine round-to-nearest; set group_size (e.g. 64)", bits=2)
