"""FP8 weights (e4m3 or e5m2) with a float32 scale per output channel or per tensor.

Each weight is divided by its scale (the row's or the tensor's absolute maximum over the format's largest value,
so the maximum maps onto it) and cast to the float8 dtype, which rounds to nearest even: the numerics of a plain
``(w / scale).to(torch.float8_e4m3fn)``. Matmuls dequantize (float8 times scale) and use the dense matmul, or,
named as ``kernel: fp8_scaled_mm_cuda`` on a GPU with FP8 tensor cores, ``torch._scaled_mm`` with the
activations cast to e4m3 per row (the W8A8 form of vLLM's and torchao's float8 rowwise; not chosen by ``auto``
because rounding the activations changes the numerics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from ..errors import UnsupportedError
from .format import WEIGHT_FORMATS, QuantizedWeightFormat
from .kernels import Kernel, register_kernel
from .linear import QuantizedLinear, linear_weight
from .primitives import check_finite
from .qtensor import WeightTensor

FP8_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def fp8_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, FP8_DTYPES[name], None)
    if dtype is None:
        raise UnsupportedError(f"this torch has no {FP8_DTYPES[name]}")
    return dtype


@dataclass
class Float8Tensor(WeightTensor):
    """Float8 values ``[out, in]`` and float32 scales ``[out, 1]`` (per channel) or ``[1, 1]`` (per tensor)."""

    data: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]

    bits = 8
    group_size = None

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("data", "scales")

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int], per_tensor: bool) -> int:
        return shape[0] * shape[1] + 4 * (1 if per_tensor else shape[0])

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape, self.scales.shape[0] == 1 and self.shape[0] > 1)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice = slice(None)) -> torch.Tensor:
        scales = self.scales.expand(self.shape[0], 1)[rows]
        return (self.data[rows].float() * scales).to(dtype)


def quantize_fp8(x: torch.Tensor, kind: str = "e4m3", per_tensor: bool = False) -> Float8Tensor:
    """``x [out, in]`` as float8 with absmax scales per row (or for the whole tensor)."""
    if x.dim() != 2:
        raise UnsupportedError(f"quantize_fp8 expects a 2-D tensor, got shape {tuple(x.shape)}")
    check_finite(x)
    dtype = fp8_dtype(kind)
    x = x.float()
    amax = x.abs().amax().reshape(1, 1) if per_tensor else x.abs().amax(dim=1, keepdim=True)
    scales = torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))
    return Float8Tensor((x / scales).to(dtype), scales, tuple(x.shape))


class FP8ScaledMMKernel(Kernel):
    """``torch._scaled_mm`` on e4m3 weights with a scale per output channel (a per-tensor scale is broadcast at
    the call) and bf16 activations cast to e4m3 with a scale per row, the product scaled by both in the matmul."""

    path = "fp8_scaled_mm_cuda"
    tensor_type: ClassVar[type] = Float8Tensor

    @classmethod
    def in_auto(cls, device: torch.device) -> bool:
        return False

    @classmethod
    def supports(cls, q: Float8Tensor, device: torch.device, dtype: torch.dtype) -> bool:
        return (device.type == "cuda" and hasattr(torch, "_scaled_mm") and dtype == torch.bfloat16
                and torch.cuda.get_device_capability(device) >= (8, 9)
                and q.data.dtype == getattr(torch, "float8_e4m3fn", None)
                and q.shape[0] % 16 == 0 and q.shape[1] % 16 == 0)

    def __init__(self, q: Float8Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape = q.shape
        self.register_buffer("data", q.data)  # [out, in] row-major: its transpose is the column-major operand
        self.register_buffer("scales", q.scales.float())

    def analytic_nbytes(self) -> int:
        return Float8Tensor.analytic_nbytes(self.shape, self.scales.shape[0] == 1 and self.shape[0] > 1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.float() * self.scales).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, n_in = self.shape
        rows = x.reshape(-1, n_in)
        e4m3 = self.data.dtype
        x_scale = (rows.abs().amax(dim=1, keepdim=True).float() / torch.finfo(e4m3).max).clamp(min=1e-12)
        x8 = (rows.float() / x_scale).to(e4m3)
        w_scale = self.scales.reshape(1, -1).expand(1, out).contiguous()
        y = torch._scaled_mm(x8, self.data.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], out)


register_kernel(FP8ScaledMMKernel, before="dequantize+matmul")


class FP8Format(QuantizedWeightFormat):
    """Linear weights stored as float8 with float32 scales; activations stay in the compute dtype."""

    kind: Literal["e4m3", "e5m2"] = Field("e4m3", description="e4m3 (more precision) or e5m2 (more range)")
    per_tensor: bool = Field(False, description="one scale for the whole weight instead of one per output channel")
    kernel: Literal["auto", "dequantize+matmul", "fp8_scaled_mm_cuda"] = Field(
        "auto", description="fp8_scaled_mm_cuda: torch._scaled_mm with activations cast to e4m3 per row (CUDA, "
        "compute capability 8.9+, bf16); auto: dequantize+matmul")

    @property
    def scheme_label(self) -> str:
        parts = ["fp8", self.kind, "pt" if self.per_tensor else "pc"]
        return "-".join(parts + self.compute_dtype_label() + ([self.kernel] if self.kernel != "auto" else []))

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return Float8Tensor.analytic_nbytes((out_features, in_features), self.per_tensor)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        q = quantize_fp8(linear_weight(module), self.kind, self.per_tensor)
        kernels = None if self.kernel == "auto" else [self.kernel]
        return QuantizedLinear.from_linear(module, q, kernels, {"method": f"fp8-{self.kind}"})


WEIGHT_FORMATS.register("fp8", "FP8 weights with a scale per output channel or tensor; fields: kind (e4m3 | e5m2), "
                        "per_tensor, compute_dtype, kernel")(FP8Format)
