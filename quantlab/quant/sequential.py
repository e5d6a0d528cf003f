"""Layer-by-layer calibration: each decoder layer sees the outputs of the already-quantized layers before it.

Inputs to the first decoder layer are captured once; then, for each layer, the
Hessians ``H = 2 X Xᵀ / n`` of its selected linear inputs are accumulated, the
layer's linears are solved and replaced, and the quantized layer is run again
to produce the next layer's inputs (as GPTQ and GPTQModel do).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from .linear import linear_weight


class _Stop(Exception):
    pass


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers (the ModuleList of ``num_hidden_layers`` blocks)."""
    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise ValueError("could not find the decoder layers of this model")


class HessianAccumulator:
    """Running ``2 X Xᵀ / n`` over every row of the inputs a linear layer sees."""

    def __init__(self, n_in: int, device: torch.device) -> None:
        self.hessian = torch.zeros(n_in, n_in, device=device)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        m = x.shape[0]
        self.hessian *= self.rows / (self.rows + m)
        self.rows += m
        x = x * (2 / self.rows) ** 0.5
        self.hessian += x.T @ x


def _capture_first_layer_inputs(model: nn.Module, layers: nn.ModuleList, samples: list[torch.Tensor]) -> list[tuple[tuple, dict]]:
    captured: list[tuple[tuple, dict]] = []

    def hook(_: nn.Module, args: tuple, kwargs: dict) -> None:
        captured.append((args, kwargs))
        raise _Stop

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for ids in samples:
            try:
                model(input_ids=ids.to(next(model.parameters()).device), use_cache=False)
            except _Stop:
                pass
    finally:
        handle.remove()
    return captured


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    return (hidden, *args[1:]), kwargs


def _run(layer: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    out = layer(*args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


Solve = Callable[[str, nn.Module, torch.Tensor], nn.Module]


@torch.no_grad()
def quantize_sequential_(model: nn.Module, selected: list[str], samples: list[torch.Tensor], solve: Solve) -> dict[str, dict[str, Any]]:
    """Replace each selected linear by ``solve(name, module, hessian)``, layer by layer.

    Returns per-module statistics: the calibration rows seen by each layer.
    """
    layers = decoder_layers(model)
    prefix = next(name for name, m in model.named_modules() if m is layers)
    inputs = _capture_first_layer_inputs(model, layers, samples)
    stats: dict[str, dict[str, Any]] = {}
    for index, layer in enumerate(layers):
        layer_prefix = f"{prefix}.{index}."
        names = [n[len(layer_prefix):] for n in selected if n.startswith(layer_prefix)]
        accumulators: dict[str, HessianAccumulator] = {}
        handles = []
        for name in names:
            module = layer.get_submodule(name)
            acc = accumulators[name] = HessianAccumulator(linear_weight(module).shape[1], linear_weight(module).device)
            handles.append(module.register_forward_hook(lambda _m, a, _o, acc=acc: acc.add(a[0])))
        for args, kwargs in inputs:
            _run(layer, args, kwargs)
        for h in handles:
            h.remove()
        for name in names:
            parent, _, child = name.rpartition(".")
            owner = layer.get_submodule(parent) if parent else layer
            new = solve(layer_prefix + name, owner.get_submodule(child), accumulators[name].hessian)
            setattr(owner, child, new)
            stats[layer_prefix + name] = {"calibration_rows": accumulators[name].rows}
        inputs = [_with_hidden(args, kwargs, _run(layer, args, kwargs)) for args, kwargs in inputs]
    return stats
