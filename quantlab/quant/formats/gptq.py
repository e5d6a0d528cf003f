"""GPTQ as a weight format: the pure solve in ``gptq_solve`` driven layer by layer on calibration data."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field, model_validator
from torch import nn

from ..activations import ActivationFormat, rounding_module
from ..calibrate.gptq_solve import gptq_quantize
from ..calibrate.layers import quantize_sequential_
from ..format import DTYPES, WEIGHT_FORMATS, Calibration
from ..forms.affine.tensor import QuantizedTensor, quantize_tensor
from ..linear import QuantizedLinear, linear_weight
from .rtn import ACTIVATIONS_FIELD, AffineFormat


def output_error(weight: torch.Tensor, q: QuantizedTensor, hessian: torch.Tensor) -> float:
    """Mean squared output error on the calibration inputs: ``tr(ΔW H ΔWᵀ) / 2`` per row of inputs."""
    delta = weight.float() - q.dequantize()
    return (0.5 * torch.einsum("oi,ij,oj->", delta, hessian, delta)).item()


class GPTQSettings(AffineFormat):
    """Fields every GPTQ backend shares; they all need calibration and quantize per channel or per group."""

    requires_calibration: ClassVar[bool] = True
    example_fields: ClassVar[dict[str, Any] | None] = {"bits": 4, "group_size": 32, "act_order": True,
                                                       "kernel": "dequantize+matmul"}
    act_order: bool = Field(False, description="visit columns by decreasing Hessian diagonal (desc_act)")
    damp: float = Field(0.01, gt=0, lt=1, description="added to the Hessian diagonal, as a share of its mean")
    true_sequential: bool = Field(True, description="within a layer, solve q/k/v, then o, then gate/up, then down, "
                                  "each on the inputs the ones before produce (GPTQ's order); false: one pass per layer")
    backend_tag: ClassVar[str] = "gptq"

    @model_validator(mode="after")
    def _no_per_tensor(self) -> "GPTQSettings":
        if self.per_tensor:
            raise ValueError("GPTQ quantizes per output channel or per group; per_tensor is not supported")
        if self.zero_point != "int":
            raise ValueError("GPTQ stores integer zero points; zero_point: float is not supported")
        return self

    @property
    def scheme_label(self) -> str:
        return f"{super().scheme_label}-{self.backend_tag}" + ("-act" if self.act_order else "") + (
            "" if self.true_sequential else "-onepass")

    @property
    def recorded_settings(self) -> dict[str, Any]:
        """What a checkpoint's quantize config records of how the weights were made."""
        return {"method": "gptq", "true_sequential": self.true_sequential, "damp_percent": self.damp}

    @property
    def stores_group_index(self) -> bool:
        return self.act_order


@WEIGHT_FORMATS.register("gptq", "GPTQ (Hessian-aware rounding, needs calibration); fields: bits, group_size, "
                         "symmetric, act_order, damp, true_sequential, block_size, clip, scale_dtype, activations, kernel")
class GPTQFormat(GPTQSettings):
    block_size: int = Field(128, ge=1, description="columns per lazy batch update")
    activations: ActivationFormat | None = ACTIVATIONS_FIELD

    def solve(self, weight: torch.Tensor, hessian: torch.Tensor) -> QuantizedTensor:
        return gptq_quantize(weight, hessian, self.bits, self.group_size, self.symmetric, self.act_order,
                             self.damp, self.block_size, DTYPES[self.scale_dtype], self.clip_search)

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        """Quantize ``selected`` linears layer by layer; records GPTQ's and RTN's output error per layer."""
        errors: dict[str, dict[str, float]] = {}

        def solve(name: str, module: nn.Module, hessian: torch.Tensor) -> nn.Module:
            weight = linear_weight(module)
            q = self.solve(weight, hessian)
            rtn = quantize_tensor(weight, self.bits, self.group_size, self.symmetric, DTYPES[self.scale_dtype],
                                  clip=self.clip_search)
            errors[name] = {"gptq": output_error(weight, q, hessian), "rtn": output_error(weight, rtn, hessian)}
            return QuantizedLinear.from_linear(module, q, self.kernels, self.recorded_settings,
                                               rounding_module(self.activations))

        stats = quantize_sequential_(model, selected, list(calibration or []), solve,
                                     true_sequential=self.true_sequential)
        return {name: {**stats[name], **{f"output_error_{k}": v for k, v in errors[name].items()}} for name in errors}
