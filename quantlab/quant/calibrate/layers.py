"""Layer-by-layer calibration: each decoder layer sees the outputs of the already-quantized layers before it.

Inputs to the first decoder layer are captured once; then, for each layer, the
Hessians ``H = 2 X Xᵀ / n`` of its selected linear inputs are accumulated, the
layer's linears are solved and replaced, and the quantized layer is run again
to produce the next layer's inputs (as GPTQ and GPTQModel do).

True-sequential (the GPTQ paper's and GPTQModel's default): within a layer, the linears are solved a group at a
time in the order they run, where a group is the linears that read the same input (q, k, v; then o; then gate,
up; then down), and each group's Hessians are taken with the groups before it already quantized. The groups
are found by running the layer once, not from a table per architecture. One pass (``true_sequential=False``)
takes every Hessian of a layer from its unquantized linears.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ...progress import progress
from ..linear import linear_weight
from ..offload import execution_device, onloaded, placed


class StopForward(Exception):
    """Raised by a forward hook to end a layer's forward once the inputs it wanted are captured."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers (the ModuleList of ``num_hidden_layers`` blocks)."""
    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise ValueError("could not find the decoder layers of this model")


def decoder_layers_name(model: nn.Module) -> str:
    """The qualified name of the model's stack of decoder layers (``model.layers``)."""
    layers = decoder_layers(model)
    return next(name for name, m in model.named_modules() if m is layers)


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
        raise StopForward

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for ids in samples:
            try:
                model(input_ids=ids.to(execution_device(model.get_input_embeddings())), use_cache=False)
            except StopForward:
                pass
    finally:
        handle.remove()
    return captured


def hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states of a captured decoder-layer call ``(args, kwargs)``."""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    """The same call with ``hidden`` as its hidden states."""
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    return (hidden, *args[1:]), kwargs


def _batched(inputs: list[tuple[tuple, dict]], batch_size: int) -> list[tuple[tuple, dict]]:
    """Stack consecutive samples of equal length into batches; the rest of the call (positions,
    rotary tables, causal mask) depends only on the length, so the first sample's is reused."""
    batches: list[tuple[tuple, dict]] = []
    group: list[tuple[tuple, dict]] = []

    def flush() -> None:
        if group:
            hidden = torch.cat([hidden_of(a, k) for a, k in group])
            batches.append(with_hidden(*group[0], hidden))
            group.clear()

    for args, kwargs in inputs:
        if group and (hidden_of(args, kwargs).shape != hidden_of(*group[0]).shape or len(group) == batch_size):
            flush()
        group.append((args, kwargs))
    flush()
    return batches


def run_layer(layer: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a decoder layer returns for a captured call."""
    out = layer(*args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


def execution_groups(layer: nn.Module, names: list[str], args: tuple, kwargs: dict) -> list[list[str]]:
    """``names`` (linears of ``layer``) in the order one forward calls them, consecutive ones that receive the
    same input tensor grouped together; a linear that does not run is a group of its own at the end."""
    calls: list[tuple[str, torch.Tensor]] = []

    def record(module_name: str):
        return lambda _m, a: calls.append((module_name, a[0]))

    handles = [layer.get_submodule(n).register_forward_pre_hook(record(n)) for n in names]
    try:
        run_layer(layer, args, kwargs)
    finally:
        for h in handles:
            h.remove()
    groups: list[list[str]] = []
    last_input: torch.Tensor | None = None
    seen: set[str] = set()
    for name, x in calls:
        if name in seen:
            continue
        seen.add(name)
        if groups and x is last_input:
            groups[-1].append(name)
        else:
            groups.append([name])
        last_input = x
    return groups + [[n] for n in names if n not in seen]


def _dense_twin(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A dense linear holding a quantized module's dequantized weight: feeds calibration data fast."""
    weight = module.dequantize_weight(dtype)
    dense = nn.Linear(weight.shape[1], weight.shape[0], bias=module.bias is not None, device=weight.device, dtype=dtype)
    dense.weight.data = weight
    if module.bias is not None:
        dense.bias.data = module.bias.data.to(dtype)
    return dense


Solve = Callable[[str, nn.Module, torch.Tensor], nn.Module]


def _hessians(layer: nn.Module, names: list[str], inputs: list[tuple[tuple, dict]]) -> dict[str, HessianAccumulator]:
    """The Hessian of each of ``names``' inputs over every calibration batch; each forward stops once the last
    of them has run (the rest of the layer does not change them)."""
    accumulators: dict[str, HessianAccumulator] = {}
    handles = []
    for name in names:
        module = layer.get_submodule(name)
        n_in = linear_weight(module).shape[1]  # (a shape: offloaded weights are on the meta device)
        acc = accumulators[name] = HessianAccumulator(n_in, execution_device(module))
        handles.append(module.register_forward_hook(lambda _m, a, _o, acc=acc: acc.add(a[0])))
    seen: set[str] = set()

    def stop_when_all_seen(name: str):
        def hook(*_: Any) -> None:
            seen.add(name)
            if len(seen) == len(names):
                raise StopForward
        return hook

    handles += [layer.get_submodule(n).register_forward_hook(stop_when_all_seen(n)) for n in names]
    try:
        for args, kwargs in inputs:
            seen.clear()
            try:
                run_layer(layer, args, kwargs)
            except StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
    return accumulators


@dataclass
class LayerStep:
    """One decoder layer of a calibrated pass: its linears to quantize (``names``, relative to ``prefix``), the
    calibration calls that reach it, and the replacements made so far."""

    prefix: str
    layer: nn.Module
    names: list[str]
    inputs: list[tuple[tuple, dict]]
    quantized: dict[str, nn.Module] = field(default_factory=dict)

    def replace(self, name: str, new: nn.Module, dtype: torch.dtype) -> None:
        """Install ``new`` for ``name`` when the layer is done; until then later linears and the next layer
        see its output through a dense twin (fast)."""
        self.quantized[name] = new
        self.layer.set_submodule(name, _dense_twin(new, dtype) if hasattr(new, "dequantize_weight") else new)


def calibrated_layers(model: nn.Module, selected: list[str], samples: list[torch.Tensor], what: str,
                      batch_size: int = 16) -> Iterator[LayerStep]:
    """Decoder layer by decoder layer, each fed the outputs of the already-quantized layers before it: the
    caller quantizes a step's linears (``step.replace``); the layer is then run on the step's inputs to make the
    next layer's, and the replacements are installed."""
    layers, prefix = decoder_layers(model), decoder_layers_name(model)
    inputs = _batched(_capture_first_layer_inputs(model, layers, samples), batch_size)
    for index, layer in enumerate(progress(layers, what)):
        layer_prefix = f"{prefix}.{index}."
        step = LayerStep(layer_prefix, layer, [n[len(layer_prefix):] for n in selected if n.startswith(layer_prefix)],
                         inputs)
        yield step
        inputs = [with_hidden(args, kwargs, run_layer(layer, args, kwargs)) for args, kwargs in inputs]
        for name, module in step.quantized.items():
            layer.set_submodule(name, module)


@torch.no_grad()
def quantize_sequential_(
    model: nn.Module, selected: list[str], samples: list[torch.Tensor], solve: Solve, batch_size: int = 16,
    true_sequential: bool = True,
) -> dict[str, dict[str, Any]]:
    """Replace each selected linear by ``solve(name, module, hessian)``, layer by layer (and, with
    ``true_sequential``, group by group within a layer).

    Returns per-module statistics: the calibration rows seen and the module's group within its layer.
    """
    stats: dict[str, dict[str, Any]] = {}
    for step in calibrated_layers(model, selected, samples, "calibrated quantization, layers", batch_size):
        layer, names = step.layer, step.names
        groups = (execution_groups(layer, names, *step.inputs[0]) if true_sequential else [names]) if names else []
        for group_index, group in enumerate(groups):
            accumulators = _hessians(layer, group, step.inputs)
            for name in group:
                original = layer.get_submodule(name)
                with onloaded(original):  # offloaded weights are brought in for the solve only
                    new = placed(solve(step.prefix + name, original, accumulators[name].hessian), original)
                step.replace(name, new, linear_weight(original).dtype)
                stats[step.prefix + name] = {"calibration_rows": accumulators[name].rows, "sequential_group": group_index}
    return stats
