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
    """Base of every transform. A per-linear one gives ``input_module`` (what the layer's inputs pass through first)
    and ``weight`` (the weight that undoes it), together leaving the layer's function unchanged; a transform that
    needs the whole model or calibration data (``requires_calibration``) overrides ``apply_`` instead."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    example_fields: ClassVar[dict[str, Any]] = {}
    requires_calibration: ClassVar[bool] = False

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def folds_entirely(self) -> bool:
        """Whether it leaves nothing to do at run time (all of it folded into weights and norms), so an export of
        the rounded weights computes what was measured."""
        return False

    rotates_inputs: ClassVar[bool] = False  # what it leaves to run time is an ``InputRotation`` per linear
    def input_module(self, in_features: int, device: torch.device) -> nn.Module:
        raise NotImplementedError

    def weight(self, weight: torch.Tensor, input_module: nn.Module) -> torch.Tensor:
        raise NotImplementedError

    def apply_(self, model: nn.Module, names: list[str], steps: dict[str, list[nn.Module]],
               samples: list[torch.Tensor] | None) -> None:
        """Change the weights of the linears ``names`` in place (computed in float32, stored in the weight's dtype)
        and append to ``steps[name]`` what each one's input must pass through; the default: ``weight`` and
        ``input_module`` per linear, one input module shared by the linears of one input size."""
        shared: dict[tuple[int, str], nn.Module] = {}
        for name in names:
            weight = model.get_submodule(name).weight
            key = (weight.shape[1], str(weight.device))
            if key not in shared:
                shared[key] = self.input_module(weight.shape[1], weight.device)
            weight.data = self.weight(weight.data.float(), shared[key]).to(weight.dtype)
            steps[name].append(shared[key])


TRANSFORMS: Registry[Transform] = Registry("transform")


class InputRotation(nn.Module):
    """An input transform that is an orthogonal rotation ``x ↦ x M / √n`` by an ``n × n`` matrix ``M`` of ±1
    entries: the run-time half of a rotation whose inverse is folded into the weight, as compressed-tensors'
    transform configs describe it (location ``input``, its weight ``M``)."""

    def matrix(self) -> torch.Tensor:
        """``M``, float32, entries ±1."""
        raise NotImplementedError

    @property
    def sylvester(self) -> bool:
        """Whether ``M`` is Sylvester's Hadamard matrix of a power-of-two order (no signs), which engines may apply
        by a fast transform instead of reading ``M``."""
        return False


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


def apply_transforms_(model: nn.Module, selected: list[str], transforms: tuple[Transform, ...],
                      samples: list[torch.Tensor] | None = None) -> None:
    """Each of ``transforms``, in order, on every linear in ``selected`` (a calibrated one on ``samples``, seeing
    the inputs the transforms before it produce): the weights changed in place and each linear's input transforms
    attached as ``module.input_transform``, run by a forward pre-hook while it is a float linear."""
    steps: dict[str, list[nn.Module]] = {name: [] for name in selected}
    for t in transforms:
        t.apply_(model, selected, steps, samples)
        for name, found in steps.items():
            if not found:
                continue
            module = model.get_submodule(name)
            module.input_transform = found[0] if len(found) == 1 else Chain(list(found))
            if not getattr(module, "_transform_hooked", False):
                module.register_forward_pre_hook(_pre_hook)
                module._transform_hooked = True
