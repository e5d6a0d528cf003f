"""QuantizedLinear: a linear layer whose weight is held by a quantized matmul kernel."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from .kernels.base import Kernel, choose_kernel
from .tensors.base import WeightTensor


@functools.cache
def linear_types() -> tuple[type[nn.Module], ...]:
    """Module types quantized as linear layers: ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2 style layers,
    weight stored transposed as ``[in, out]``); transformers is imported on first use, not with quantlab."""
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def linear_weight(module: nn.Module) -> torch.Tensor:
    """The weight of a linear-like module as ``[out, in]``."""
    if isinstance(module, nn.Linear):
        return module.weight.data
    return module.weight.data.t()


class QuantizedLinear(nn.Module):
    """``y = x @ Wᵀ + b`` with W held by a ``Kernel`` (packed codes, scales, zeros in that kernel's layout)."""

    def __init__(self, kernel: Kernel, bias: torch.Tensor | None, form: str,
                 settings: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.kernel = kernel
        self.out_features, self.in_features = kernel.shape
        self.form = form  # the stored form in a few words (WeightTensor.describe)
        self.settings = dict(settings or {})  # how the codes were chosen (method, true_sequential...), for exports
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.register_buffer("input_scale", None)  # [in]: multiplies the input (AWQ's unfolded scales); or None
        self.input_rounding: nn.Module | None = None  # rounds the input to a format's grid (W4A4, W8A8), or None
        self.input_transform: nn.Module | None = None  # maps the input first (a rotation folded into the weight)

    @classmethod
    def from_linear(cls, module: nn.Module, q: WeightTensor, kernels: list[str] | None = None,
                    settings: dict[str, Any] | None = None,
                    input_rounding: nn.Module | None = None) -> "QuantizedLinear":
        """Replace ``module``'s weight by ``q``, stored for the fastest kernel among ``kernels`` (default: any);
        ``settings`` records how the codes were chosen (a checkpoint's quantize config repeats it); ``input_rounding``
        rounds every input first (a format's ``activations``)."""
        weight = linear_weight(module)
        fmt = getattr(input_rounding, "fmt", None)
        kernel = choose_kernel(q, weight.device, weight.dtype, kernels, fmt)
        bias = module.bias.data.clone() if getattr(module, "bias", None) is not None else None
        layer = cls(kernel, bias, q.describe(), settings)
        layer.input_rounding = input_rounding
        layer.input_transform = getattr(module, "input_transform", None)  # a transform's (quant.transforms)
        return layer

    @property
    def kernel_path(self) -> str:
        return self.kernel.path

    def set_input_scale(self, scale: torch.Tensor, dtype: torch.dtype) -> None:
        """Multiply every input by ``scale [in]``, held as ``dtype`` (the activations'), before the matmul."""
        self.input_scale = scale.to(dtype)

    def dequantize_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the layer applies, ``[out, in]`` (an input scale folded into its columns, an input transform
        ``T`` undone: ``x ↦ T(x) Wᵀ`` is ``x (W Tᵀ)ᵀ`` for the linear map ``T``)."""
        if self.input_scale is None and self.input_transform is None:
            return self.kernel.dequantize(dtype)
        w = self.kernel.dequantize(torch.float32)
        if self.input_scale is not None:
            w = w * self.input_scale.float()
        if self.input_transform is not None:
            eye = torch.eye(self.in_features, device=w.device)
            w = w @ self.input_transform(eye).float().T
        return w.to(dtype)

    def analytic_weight_bytes(self) -> int:
        """Bytes the layer needs (kernel layout + bias + input scale), from its shape, bits and groups alone."""
        extra = sum(t.numel() * t.element_size() for t in (self.bias, self.input_scale) if t is not None)
        return self.kernel.analytic_nbytes() + extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_transform is not None:
            x = self.input_transform(x)
        if self.input_scale is not None:
            x = x * self.input_scale.to(x.dtype)
        y = None
        if self.input_rounding is not None:
            y = self.kernel.rounded_matmul(x, self.input_rounding)
            x = x if y is not None else self.input_rounding(x)
        y = self.kernel(x) if y is None else y
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.form}, kernel={self.kernel_path}"
