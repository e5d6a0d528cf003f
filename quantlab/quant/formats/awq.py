"""AWQ: activation-aware weight quantization (Lin et al., 2023), in AutoAWQ's form.

Decoder layer by decoder layer (each seeing the outputs of the quantized layers before it, as for GPTQ), and
within a layer for each group of linears that read the same input (q/k/v; o; gate/up; down), found by running
the layer, not from a table per architecture:

1. ``x̄``: the mean ``|x|`` of each input channel over every calibration token; ``w̄``: the mean over output rows
   of the weights divided by their quantization group's max ``|w|`` (AutoAWQ's duo scaling).
2. Grid search over ``α ∈ {0, 1/n, ..., (n-1)/n}``: ``s = x̄^α / (w̄^(1-α) + 1e-4)`` (or ``x̄^α``), normalized so
   that ``sqrt(max s · min s) = 1``; keep the ``s`` whose pseudo-quantized ``Q(W·s)/s`` gives the least mean
   squared error in the output of the smallest module holding the group (the attention block for q/k/v, the MLP
   for gate/up, the linear itself otherwise), measured on the first ``search_tokens`` calibration tokens.
3. Fold ``1/s`` into the module whose output is the group's input (a norm's weight, or the rows of a linear such
   as up_proj before down_proj) where that is an identity of the layer. This is checked, not assumed: the
   layer is run with the fold applied at random power-of-two scales (exact in floating point) and must give the
   same output. Where no module passes (o_proj after grouped-query attention), ``1/s`` stays on the quantized
   linear as an input scale: ``n_in`` more values, multiplied into its input at each call.
4. AutoAWQ's clip search: for each linear but the query and key projections, each group's range ``±m·(1-i/20)``,
   ``i < 10``, that least changes the group's partial outputs on 512 sampled tokens.
5. Integer affine round-to-nearest of the scaled, clipped weight (``quantize_tensor``): the bytes and kernels
   are those of ``rtn`` with the same bits and groups (input scales, where kept, add ``n_in`` values).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
from pydantic import Field, model_validator
from torch import nn

from ...errors import UnsupportedError
from ..calibrate.layers import StopForward, calibrated_layers, execution_groups, hidden_of, run_layer, with_hidden
from ..format import DTYPES, WEIGHT_FORMATS, Calibration
from ..forms.affine.tensor import padded_columns, quantize_tensor
from ..linear import QuantizedLinear, linear_types, linear_weight
from ..offload import is_dispatched
from .rtn import AffineFormat

PseudoQuantize = Callable[[torch.Tensor], torch.Tensor]  # weight [out, in] -> its quantized-dequantized values
LayerCall = tuple[tuple, dict]
CLIP_SKIPPED = ("q_", "k_", "query", "key", "Wqkv")  # AutoAWQ's: their outputs meet in q·kᵀ, not measured here


def weight_means(weights: list[torch.Tensor], group_size: int | None) -> torch.Tensor:
    """Per input channel, the mean over every output row of ``|w|`` divided by its group's max ``|w|``."""
    w = torch.cat(weights).float().abs()
    out, n_in = w.shape
    width = group_size or n_in
    groups = padded_columns(w, -(-n_in // width) * width).reshape(out, -1, width)
    normalized = groups / (groups.amax(dim=-1, keepdim=True) + 1e-6)
    return normalized.reshape(out, -1)[:, :n_in].mean(dim=0)


def candidate_scales(x_mean: torch.Tensor, w_mean: torch.Tensor | None, ratio: float) -> torch.Tensor:
    """AWQ's per-input-channel scales for exponent ``ratio`` (``w_mean`` None: activation only)."""
    if w_mean is not None:
        s = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
    else:
        s = x_mean.pow(ratio).clamp(min=1e-4)
    s = s / (s.max() * s.min()).sqrt()
    return torch.where(torch.isfinite(s), s, torch.ones_like(s))


def _set_linear_weight(module: nn.Module, weight: torch.Tensor) -> None:
    """Set a linear-like module's weight from ``[out, in]`` (Conv1D stores it transposed)."""
    module.weight.data = (weight if isinstance(module, nn.Linear) else weight.t().contiguous()).to(module.weight.dtype)


def _mse(reference: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
    total = sum(((o.float() - r.float()) ** 2).sum().item() for r, o in zip(reference, outputs))
    return total / sum(r.numel() for r in reference)


@torch.no_grad()
def search_scales(
    linears: list[nn.Module], parent: nn.Module, parent_calls: list[LayerCall], x_mean: torch.Tensor,
    pseudo_quantize: PseudoQuantize, group_size: int | None, grid: int = 20, duo_scaling: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scales ``s`` of the grid that least change ``parent``'s output on ``parent_calls`` when the
    ``linears`` hold ``pseudo_quantize(W·s)/s``; with the chosen ratio and the mean squared output errors with
    these scales and without any (round-to-nearest). The linears' weights are left as they were."""
    originals = [linear_weight(m).clone() for m in linears]
    w_mean = weight_means(originals, group_size) if duo_scaling else None
    reference = [run_layer(parent, *call) for call in parent_calls]
    x_mean = x_mean.float()

    def error(s: torch.Tensor) -> float:
        for module, w in zip(linears, originals):
            _set_linear_weight(module, pseudo_quantize(w.float() * s) / s)
        return _mse(reference, [run_layer(parent, *call) for call in parent_calls])

    best: tuple[float, float, torch.Tensor] | None = None
    try:
        for step in range(grid):
            ratio = step / grid
            s = candidate_scales(x_mean, w_mean, ratio)
            loss = error(s)
            if best is None or loss < best[0]:
                best = (loss, ratio, s)
        rtn = error(torch.ones_like(x_mean))
    finally:
        for module, w in zip(linears, originals):
            _set_linear_weight(module, w)
    assert best is not None
    return best[2], {"awq_ratio": best[1], "output_error_awq": best[0], "output_error_rtn": rtn}


@torch.no_grad()
def search_clip(
    weight: torch.Tensor, inputs: torch.Tensor, group_size: int | None, pseudo_quantize: PseudoQuantize,
    grid: int = 20, max_shrink: float = 0.5, tokens: int = 512, rows_per_batch: int = 64,
) -> torch.Tensor:
    """AutoAWQ's clip search: per output row and group, the largest ``|w|`` bound ``m·(1 - i/grid)``,
    ``i < max_shrink·grid``, whose quantization least changes the group's partial products on ``tokens``
    evenly spaced rows of ``inputs [tokens, in]``. Returns the bounds ``[out, n_groups]``."""
    out, n_in = weight.shape
    width = group_size or n_in
    padded = -(-n_in // width) * width
    x = padded_columns(inputs.reshape(-1, n_in).float(), padded)
    x = x[:: max(1, x.shape[0] // tokens)].reshape(-1, padded // width, width)  # [tokens, groups, width]
    w_all = padded_columns(weight.float(), padded).reshape(out, -1, width)
    bounds = []
    for start in range(0, out, rows_per_batch):
        w = w_all[start:start + rows_per_batch]
        original_max = w.abs().amax(dim=-1, keepdim=True)
        best_max, best_err = original_max.clone(), torch.full_like(original_max, float("inf"))
        reference = torch.einsum("tgk,ogk->otg", x, w)
        for step in range(int(max_shrink * grid)):
            bound = original_max * (1 - step / grid)
            clipped = torch.clamp(w, -bound, bound)
            q = pseudo_quantize(clipped.reshape(clipped.shape[0], -1)).reshape(clipped.shape)
            err = (torch.einsum("tgk,ogk->otg", x, q) - reference).pow(2).mean(dim=1).unsqueeze(-1)
            better = err < best_err
            best_err[better], best_max[better] = err[better], bound[better]
        bounds.append(best_max.squeeze(-1))
    return torch.cat(bounds)


def clip_to(weight: torch.Tensor, bounds: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``weight [out, in]`` clamped to ``±bounds [out, n_groups]`` group by group."""
    out, n_in = weight.shape
    width = group_size or n_in
    b = bounds.unsqueeze(-1)
    w = padded_columns(weight.float(), bounds.shape[1] * width).reshape(out, -1, width)
    return torch.clamp(w, -b, b).reshape(out, -1)[:, :n_in]


# -- folding 1/s into the module before ------------------------------------------------------------------------

def _output_features(module: nn.Module) -> int | None:
    """Features a module's output has per position, where scaling them is a parameter change: the output rows
    of a linear, or the elements of a norm-like module's 1-D weight."""
    if isinstance(module, linear_types()):
        return linear_weight(module).shape[0]
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 1 and not list(module.children()):
        return weight.numel()
    return None


def _scale_output_(module: nn.Module, factor: torch.Tensor) -> None:
    """Multiply ``module``'s output features by ``factor`` through its parameters."""
    if isinstance(module, nn.Linear) or not isinstance(module, linear_types()):
        shape = (-1, 1) if isinstance(module, nn.Linear) else (-1,)
    else:  # Conv1D: weight [in, out]
        shape = (1, -1)
    module.weight.data = (module.weight.data.float() * factor.view(shape)).to(module.weight.dtype)
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor):
        bias.data = (bias.data.float() * factor).to(bias.dtype)


def _scale_inputs_(linears: list[nn.Module], factor: torch.Tensor) -> None:
    for module in linears:
        _set_linear_weight(module, linear_weight(module).float() * factor)


def _call_capturing(layer: nn.Module, call: LayerCall, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layer output, the input module received)`` for one call of the layer."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _m, a: seen.append(a[0]) if not seen else None)
    try:
        y = run_layer(layer, *call)
    finally:
        handle.remove()
    return y, seen[0]


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@torch.no_grad()
def fold_target(layer: nn.Module, group: list[str], call: LayerCall, tolerance: float = 1e-3) -> str | None:
    """The module (name within ``layer``) whose output is the input of ``group`` and into which ``1/s`` folds:
    dividing its output features by ``s`` and multiplying the group's input columns by ``s`` leaves the
    layer's output unchanged. Tried nearest first, at random power-of-two ``s`` (exact in floating point)."""
    order: list[str] = []
    handles = [m.register_forward_pre_hook(lambda _m, _a, n=n: order.append(n) if n not in order else None)
               for n, m in layer.named_modules() if n]
    first = layer.get_submodule(group[0])
    try:
        y, x = _call_capturing(layer, call, first)
    finally:
        for h in handles:
            h.remove()
    n_in = x.shape[-1]
    linears = [layer.get_submodule(n) for n in group]
    before = order[:order.index(group[0])] if group[0] in order else []
    candidates = [n for n in reversed(before) if n not in group
                  and _output_features(layer.get_submodule(n)) == n_in]
    generator = torch.Generator().manual_seed(0)
    s = torch.where(torch.rand(n_in, generator=generator) < 0.5, 0.5, 2.0)
    for name in candidates:
        module = layer.get_submodule(name)
        saved = [t.data.clone() for t in [*module.parameters(recurse=False), *(m.weight for m in linears)]]
        try:
            _scale_output_(module, 1 / s)
            _scale_inputs_(linears, s)
            y2, x2 = _call_capturing(layer, call, first)
        finally:
            for t, data in zip([*module.parameters(recurse=False), *(m.weight for m in linears)], saved):
                t.data = data
        if _relative_error(y2, y) < tolerance and _relative_error(x2 * s.to(x2.dtype), x) < tolerance:
            return name
    return None


def fold_(layer: nn.Module, target: str, group: list[str], scales: torch.Tensor) -> None:
    """Divide ``target``'s output features by ``scales`` and multiply the group's input columns by them."""
    _scale_output_(layer.get_submodule(target), 1 / scales)
    _scale_inputs_([layer.get_submodule(n) for n in group], scales)


# -- the layer pass -----------------------------------------------------------------------------------------

def enclosing_module(group: list[str]) -> str:
    """The smallest module holding every linear of ``group`` (the linear itself for one; "" is the layer)."""
    if len(group) == 1:
        return group[0]
    common = []
    for parts in zip(*(n.split(".") for n in group)):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common)


@torch.no_grad()
def _group_statistics(layer: nn.Module, group: list[str], inputs: list[LayerCall], searched: int,
                      ) -> tuple[torch.Tensor, list[LayerCall]]:
    """Mean ``|x|`` per channel of the group's input over every call, and the calls of the enclosing module for
    the first ``searched`` layer calls; each layer call stops at the group's input."""
    parent = layer.get_submodule(enclosing_module(group))
    calls: list[LayerCall] = []
    total: list[torch.Tensor] = []
    count = [0]
    keep = [False]

    def on_parent(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        if keep[0]:
            calls.append((args, kwargs))

    def on_input(_m: nn.Module, args: tuple) -> None:
        x = args[0].reshape(-1, args[0].shape[-1])
        total.append(x.abs().float().sum(dim=0))
        count[0] += x.shape[0]
        raise StopForward

    handles = [parent.register_forward_pre_hook(on_parent, with_kwargs=True),
               layer.get_submodule(group[0]).register_forward_pre_hook(on_input)]
    try:
        for index, call in enumerate(inputs):
            keep[0] = index < searched
            try:
                run_layer(layer, *call)
            except StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
    if not total:
        raise UnsupportedError(f"AWQ: {group[0]} never ran on the calibration data")
    return torch.stack(total).sum(dim=0) / count[0], calls


@torch.no_grad()
def _linear_inputs(layer: nn.Module, names: list[str], calls: list[LayerCall]) -> dict[str, torch.Tensor]:
    """Every input row each of ``names`` received over ``calls``, ``[tokens, in]``."""
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = [layer.get_submodule(n).register_forward_pre_hook(
        lambda _m, a, n=n: rows[n].append(a[0].reshape(-1, a[0].shape[-1]))) for n in names]
    try:
        for call in calls:
            run_layer(layer, *call)
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(r) for n, r in rows.items() if r}


@WEIGHT_FORMATS.register("awq", "AWQ (activation-aware scales, folded where exact, then RTN; needs calibration); "
                         "fields: bits, group_size, symmetric, grid, duo_scaling, search_clip, search_tokens, "
                         "scale_dtype, kernel")
class AWQFormat(AffineFormat):
    requires_calibration: ClassVar[bool] = True
    example_fields: ClassVar[dict[str, Any] | None] = {"bits": 4, "group_size": 32, "search_tokens": 512}
    estimate_is_exact: ClassVar[bool] = False  # input scales kept where the fold is not exact are found on the model
    grid: int = Field(20, ge=1, description="exponents tried: 0, 1/grid, ..., (grid-1)/grid")
    duo_scaling: bool = Field(True, description="scales from activations and weights (AutoAWQ's default); "
                              "false: activations only")
    search_clip: bool = Field(True, description="AutoAWQ's clip search after scaling (not for q/k projections)")
    search_tokens: int = Field(8192, ge=1, description="calibration tokens the scale search measures the output "
                               "error on (every token feeds the activation means)")

    @model_validator(mode="after")
    def _awq_fields(self) -> "AWQFormat":
        if self.per_tensor or self.clip != "none" or self.zero_point != "int":
            raise ValueError("awq quantizes per channel or per group with integer zero points and its own clip "
                             "search: per_tensor, clip and zero_point do not apply")
        return self

    @property
    def scheme_label(self) -> str:
        return f"{super().scheme_label}-awq" + ("" if self.search_clip else "-noclip") + (
            "" if self.duo_scaling else "-xonly")

    exports_decided_at_export: ClassVar[bool] = True

    @property
    def exports(self) -> tuple[str, ...]:
        # Whether every scale folds depends on the model (o_proj after grouped-query attention keeps its own input
        # scale, which no target holds): an AWQ variant exports where it folded, checked at export.
        return ()

    def pseudo_quantize(self, weight: torch.Tensor) -> torch.Tensor:
        q = quantize_tensor(weight, self.bits, self.group_size, self.symmetric, DTYPES[self.scale_dtype])
        return q.dequantize(torch.float32)

    @torch.no_grad()
    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        if is_dispatched(model):
            raise UnsupportedError("awq folds scales into the model's norms and linears: load the model on one "
                                   "device (no device_map)")
        details: dict[str, dict[str, Any]] = {}
        searched = 0
        for step in calibrated_layers(model, selected, list(calibration or []), "AWQ, layers"):
            layer, names, inputs = step.layer, step.names, step.inputs
            if not searched:  # the calls that reach the first search_tokens tokens (the batching is fixed)
                tokens = torch.tensor([hidden_of(*call).shape[:-1].numel() for call in inputs]).cumsum(0)
                searched = min(int((tokens < self.search_tokens).sum()) + 1, len(inputs))
            input_scales: dict[str, torch.Tensor] = {}
            for group_index, group in enumerate(execution_groups(layer, names, *inputs[0]) if names else []):
                x_mean, parent_calls = _group_statistics(layer, group, inputs, searched)
                linears = [layer.get_submodule(n) for n in group]
                parent = layer.get_submodule(enclosing_module(group))
                scales, found = search_scales(linears, parent, parent_calls, x_mean, self.pseudo_quantize,
                                              self.group_size, self.grid, self.duo_scaling)
                target = fold_target(layer, group, _first_sample(inputs[0]))
                if target is not None:
                    fold_(layer, target, group, scales)
                else:
                    input_scales.update({n: scales for n in group})
                for n in group:
                    details[step.prefix + n] = {**found, "awq_scales_in": target or "input scale",
                                                "sequential_group": group_index}
            linear_inputs = _linear_inputs(layer, names, inputs[:searched]) if self.search_clip else {}
            for name in names:
                module = layer.get_submodule(name)
                weight = linear_weight(module).float()
                s = input_scales.get(name)
                if s is not None:
                    weight = weight * s
                if self.search_clip and name in linear_inputs and not any(k in name for k in CLIP_SKIPPED):
                    x = linear_inputs[name].float() / (s if s is not None else 1)
                    weight = clip_to(weight, search_clip(weight, x, self.group_size, self.pseudo_quantize),
                                     self.group_size)
                q = quantize_tensor(weight, self.bits, self.group_size, self.symmetric, DTYPES[self.scale_dtype])
                new = QuantizedLinear.from_linear(module, q, self.kernels, {"method": "awq"})
                if s is not None:
                    new.set_input_scale(1 / s, linear_weight(module).dtype)
                step.replace(name, new, linear_weight(module).dtype)
        return details


def _first_sample(call: LayerCall) -> LayerCall:
    """The first sample of a batched layer call (the rest of the call depends only on the length)."""
    return with_hidden(*call, hidden_of(*call)[:1])
