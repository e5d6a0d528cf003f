"""FP8 weights through ``torch._scaled_mm`` (CUDA, compute capability 8.9+): the activations cast to e4m3 per row,
the W8A8 form of vLLM's and torchao's float8 rowwise. Never chosen by ``auto``: rounding the activations
changes the numerics."""
from __future__ import annotations

from typing import ClassVar

import torch

from ..tensors.float8 import Float8Tensor
from .base import KERNELS, Kernel


@KERNELS.register
class FP8ScaledMMKernel(Kernel):
    """``torch._scaled_mm`` on e4m3 weights with a scale per output channel (a per-tensor scale is broadcast at
    the call) and bf16 activations cast to e4m3 with a scale per row, the product scaled by both in the matmul."""

    path = "fp8_scaled_mm_cuda"
    preference = 70
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


