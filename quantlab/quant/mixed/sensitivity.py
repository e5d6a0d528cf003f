"""Per-group sensitivity in one process, fast enough to run inside a weight format (``mixed``).

The model's next-token distributions on a few windows of text are taken once (the reference); then, for each
group of linears and each candidate format, the group's linears are swapped for quantized ones, the model is run
on the same windows and the divergence from the reference is measured (``divergence.compare``), and the originals
are put back. Two things keep this cheap:

- the decoder layers before a group's first layer give the same output as in the reference pass, so they are
  replaced for that pass by stand-ins that return the recorded output (a group in layer 20 of 30 runs 10 layers);
- a candidate that needs calibration (GPTQ, AWQ) is applied once to a copy of the model and its quantized linears
  are swapped in one group at a time, rather than calibrating again for every group. Each linear was then solved
  with the earlier linears of the same candidate already quantized, as in a full application: the usual
  approximation of sensitivity scans.
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ...fidelity.divergence import compare, reference
from ...progress import progress
from ..calibrate.layers import decoder_layers
from ..embedding import tied_block_embedding
from ..format import Calibration, WeightFormat
from ..offload import execution_device
from .groups import ModuleGroup

FIGURES = ("kl_divergence_mean", "kl_divergence_p99", "top1_agreement_percent", "delta_perplexity")


class _Replay(nn.Module):
    """Stands in for a decoder layer: returns the recorded output of the last replayed layer, batch by batch."""

    def __init__(self, original: nn.Module, outputs: list[Any], counter: list[int], advances: bool) -> None:
        super().__init__()
        object.__setattr__(self, "_original", original)  # not a submodule: its attributes only (attention_type...)
        self._outputs, self._counter, self._advances = outputs, counter, advances

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._advances:
            self._counter[0] += 1
        return self._outputs[self._counter[0]]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_original"), name)


@contextmanager
def _replayed(layers: nn.ModuleList, outputs: list[list[Any]], start: int | None) -> Iterator[None]:
    """Layers ``0 .. start - 1`` replaced by replays of layer ``start - 1``'s recorded outputs."""
    if not start:
        yield
        return
    originals = list(layers[:start])
    counter = [-1]
    for i in range(start):
        layers[i] = _Replay(originals[i], outputs[start - 1], counter, advances=i == 0)
    try:
        yield
    finally:
        for i, layer in enumerate(originals):
            layers[i] = layer


@contextmanager
def _swapped(model: nn.Module, replacements: dict[str, nn.Module]) -> Iterator[None]:
    originals = {name: model.get_submodule(name) for name in replacements}
    for name, module in replacements.items():
        model.set_submodule(name, module)
    try:
        yield
    finally:
        for name, module in originals.items():
            model.set_submodule(name, module)


def _calibrated_bank(model: nn.Module, fmt: WeightFormat, names: list[str], calibration: Calibration,
                     shared: dict[Any, Any]) -> dict[str, nn.Module]:
    """Every one of ``names`` quantized by one calibrated application of ``fmt`` to a copy of the model (what it
    observes of the unquantized model shared with the other candidates through ``shared``)."""
    fmt.observe_(model, names, calibration, shared)
    twin = copy.deepcopy(model)
    done = fmt.apply_(twin, names, calibration)
    return {name: twin.get_submodule(name) for name in done}


def _tied_table(model: nn.Module) -> tuple[str, str, nn.Module] | None:
    """(output head's name, token embedding's name, the embedding) where the two share one table, else None."""
    from ..apply import default_exclude, tied_embedding

    heads = default_exclude(model)
    if not heads or not tied_embedding(model):
        return None
    table = model.get_input_embeddings()
    return heads[0], next(n for n, m in model.named_modules() if m is table), table


def scan_samples(calibration: Calibration, tokens: int) -> list[torch.Tensor]:
    """The first calibration windows holding ``tokens`` tokens (at least one window): the text a scan scores."""
    window = calibration.samples[0].shape[-1]
    return calibration.samples[:max(1, math.ceil(tokens / window))]


SCAN_TOP_K = 128  # the scan ranks groups: KL from the baseline's top 128 tokens + a bucket (a lower bound)


@torch.no_grad()
def scan(model: nn.Module, groups: list[ModuleGroup], candidates: list[WeightFormat], samples: list[torch.Tensor],
         calibration: Calibration | None, batch_size: int = 4, top_k: int = SCAN_TOP_K,
         done: set[tuple[str, str]] = frozenset(), on_row: Callable[[dict[str, Any]], None] | None = None,
         ) -> list[dict[str, Any]]:
    """One row per (group, candidate): the divergence of the model with only that group in that format.

    ``samples``: token windows ``[1, seq]`` of equal length, the text scored. ``calibration``: for candidates that
    need it. Rows carry the group, its layer and module type, the candidate's label and the divergence figures.
    ``done``: (group, format label) pairs to skip (a resumed scan); ``on_row`` sees each row as it is measured.
    """
    device = execution_device(model.get_input_embeddings())
    ids = torch.cat([s.reshape(-1) for s in samples])
    window = samples[0].shape[-1]
    layers = decoder_layers(model)
    outputs: list[list[Any]] = [[] for _ in layers]
    hooks = [layer.register_forward_hook(lambda _m, _a, out, i=i: outputs[i].append(out)) for i, layer in enumerate(layers)]
    try:
        ref = reference(model, ids, window, batch_size, device, top_k, what=None)
    finally:
        for h in hooks:
            h.remove()
    names = [n for g in groups for n in g.modules]
    rows: list[dict[str, Any]] = []
    steps = progress([(c, g) for c in candidates for g in groups if (g.name, c.scheme_label) not in done],
                     "sensitivity, groups x formats")
    bank: dict[str, nn.Module] = {}
    shared: dict[Any, Any] = {}
    tied = _tied_table(model)
    current: WeightFormat | None = None
    for fmt, group in steps:
        if fmt is not current:
            current = fmt
            bank = _calibrated_bank(model, fmt, names, calibration, shared) if fmt.needs_calibration else {}
        replacements = {n: m for n in group.modules
                        if (m := bank.get(n) if fmt.needs_calibration else fmt.replacement(model, n)) is not None}
        if tied is not None and tied[0] in replacements and fmt.head_holds_lookup_table:
            # the lookup reads the replaced head's blocks, as the applied format will have it (one table)
            lookup = tied_block_embedding(tied[2], replacements[tied[0]])
            if lookup is not None:
                replacements[tied[1]] = lookup
        row = {"group": group.name, "layer": group.layer, "module_type": group.kind, "format": fmt.scheme_label}
        if not replacements:  # the format keeps these linears as they are
            row.update(kl_divergence_mean=0.0, kl_divergence_p99=0.0, top1_agreement_percent=100.0, delta_perplexity=0.0)
        else:
            with _swapped(model, replacements), _replayed(layers, outputs, group.first_layer):
                figures = compare(model, ids, ref, batch_size, device, what=None)
            row.update({k: figures[k] for k in FIGURES})
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
