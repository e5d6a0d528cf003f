"""The transform registry and how transforms reach a model: ``apply_transforms_`` changes each selected linear's
weight in place and gives it an input transform (``module.input_transform``), run by a forward pre-hook while the
layer is a float linear (so calibrated formats such as GPTQ see the transformed inputs) and by ``QuantizedLinear``
once the weight format has replaced it."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from ...registry import Registry


class Transform(BaseModel):
    """Base of every transform: ``weight`` maps a linear's weight ``[out, in]``, ``input_module`` the module its
    inputs pass through first; together they leave the layer's function unchanged."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    example_fields: ClassVar[dict[str, Any]] = {}

    @property
    def label(self) -> str:
        raise NotImplementedError

    def input_module(self, in_features: int, device: torch.device) -> nn.Module:
        raise NotImplementedError

    def weight(self, weight: torch.Tensor, input_module: nn.Module) -> torch.Tensor:
        raise NotImplementedError


TRANSFORMS: Registry[Transform] = Registry("transform")


class Chain(nn.Module):
    """Input transforms applied in order."""

    def __init__(self, steps: list[nn.Module]) -> None:
        super().__init__()
        self.steps = nn.ModuleList(steps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        return x


def _pre_hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (module.input_transform(args[0]), *args[1:])


def apply_transforms_(model: nn.Module, selected: list[str], transforms: tuple[Transform, ...]) -> None:
    """Each of ``transforms``, in order, on every linear in ``selected``: its weight changed in place (computed in
    float32, stored in the weight's dtype) and its input transform attached (shared by layers of one input size)."""
    shared: dict[tuple[int, int, str], nn.Module] = {}
    for name in selected:
        module = model.get_submodule(name)
        weight = module.weight
        steps = []
        for k, t in enumerate(transforms):
            key = (k, weight.shape[1], str(weight.device))
            if key not in shared:
                shared[key] = t.input_module(weight.shape[1], weight.device)
            steps.append(shared[key])
            weight.data = t.weight(weight.data.float(), shared[key]).to(weight.dtype)
        module.input_transform = steps[0] if len(steps) == 1 else Chain(steps)
        module.register_forward_pre_hook(_pre_hook)
