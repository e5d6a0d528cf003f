"""``quantize_(model, fmt)``: apply a weight format to a model in place."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .format import Calibration, WeightFormat
from .linear import QuantizedLinear, linear_types


@dataclass
class QuantizeReport:
    """Which modules a format replaced, and which linear modules it left alone."""

    replaced: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # per replaced module, from the format


def default_exclude(model: nn.Module) -> list[str]:
    """Module names kept in the base dtype by default: the output embedding (lm_head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, m in model.named_modules() if head is not None and m is head]


def select_linears(model: nn.Module) -> tuple[list[str], list[str]]:
    """Split the linear modules into (selected, kept): the default selection takes every linear but the output
    head (``default_exclude``)."""
    heads = set(default_exclude(model))
    selected, kept = [], []
    for name, module in model.named_modules():
        if isinstance(module, linear_types()):
            (kept if name in heads else selected).append(name)
    return selected, kept


def quantize_(
    model: nn.Module,
    fmt: WeightFormat,
    calibration: Calibration | list[torch.Tensor] | None = None,
) -> QuantizeReport:
    """Apply ``fmt`` to ``model`` in place.

    ``calibration``: token-id tensors ``[1, seq]`` (or a ``Calibration``, e.g. from ``calibration_from_text``) for
    formats that need them. Every linear layer is quantized except the output embedding; embeddings and norms stay
    in the base dtype. The format's own ``include`` / ``exclude`` globs on module names (e.g. ``"*.mlp.*"``) and its
    ``overrides`` choose among those (overrides are applied first, so a calibrated format sees them already
    quantized; an override naming the output head, e.g. ``lm_head``, quantizes it too).
    """
    if fmt.needs_calibration and calibration is None:
        raise ValueError(f"weight format {fmt.label} needs calibration data (a list of token-id tensors)")
    if calibration is not None and not isinstance(calibration, Calibration):
        calibration = Calibration(list(calibration))
    fmt.prepare_model_(model)
    tied = tied_embedding(model)
    selected, kept = select_linears(model)
    for head in default_exclude(model):
        found = fmt.head_format(head) if head in kept else None
        if found is not None and found.calibrates_head:
            raise ValueError(f"the output head ({head}) takes only formats without calibration data, not {found.label}")
        if found is not None:
            kept.remove(head)
            selected.append(head)
    assigned: dict[str, list[str]] = {}
    formats: dict[str, WeightFormat] = {}
    for name in selected:
        f = fmt.format_for(name)
        if f is None:
            kept.append(name)
            continue
        key = "" if f is fmt else f.label
        formats[key] = f
        assigned.setdefault(key, []).append(name)
    details: dict[str, Any] = {}
    for key, names in assigned.items():  # each format's transforms on its linears, before any is rounded
        if formats[key].transforms:
            from .transforms import apply_transforms_

            apply_transforms_(model, names, formats[key].transforms, calibration.samples if calibration else None)
    for key in sorted(assigned, key=lambda k: k == ""):  # the overrides, then the entry's own format
        found = formats[key].apply_(model, assigned[key], calibration)
        details.update({n: {**d, "format": formats[key].scheme_label} if fmt.overrides else d for n, d in found.items()})
    if calibration is not None:  # input roundings with a static scale observe the calibration text, all at once
        from .activations import calibrate_activations_

        calibrate_activations_(model, calibration.samples)
    kept += [name for names in assigned.values() for name in names if name not in details]
    details.update(_embedding_(model, fmt, tied))
    return QuantizeReport(replaced=list(details), kept=kept, details=details)


def tied_embedding(model: nn.Module) -> bool:
    """Whether the input embedding and the output head are one tensor."""
    table = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weights = [getattr(m, "weight", None) for m in (table, head)]
    return all(isinstance(w, torch.Tensor) for w in weights) and \
        weights[0].untyped_storage().data_ptr() == weights[1].untyped_storage().data_ptr()  # type: ignore[union-attr]


def _embedding_(model: nn.Module, fmt: WeightFormat, tied: bool) -> dict[str, Any]:
    """The token embedding in ggml blocks where the weights say so: a tied one whose head now holds blocks reads
    the head's (one table, as a GGUF without ``output.weight``); an untied one in the format's
    ``embedding_format`` where that stores blocks. Returns its details (empty: the table is kept)."""
    from .embedding import block_embedding_
    from .forms.ggml.tensor import GGMLBlockTensor

    table = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if not isinstance(table, nn.Embedding):
        return {}
    name = next(n for n, m in model.named_modules() if m is table)
    new = None
    if tied:
        new = block_embedding_(model)
    elif (found := fmt.embedding_format) is not None:
        as_linear = nn.Linear(table.embedding_dim, table.num_embeddings, bias=False, device="meta")
        as_linear.weight = table.weight  # the table as a weight [vocab, dim]: the format's own quantizer rounds it
        quantized = found.quantize_module(name, as_linear)
        stored = quantized.kernel.stored() if isinstance(quantized, QuantizedLinear) else None
        new = block_embedding_(model, stored) if isinstance(stored, GGMLBlockTensor) else None
    return {} if new is None else {name: {"ggml_type": new.ggml_type, **({"tied_to_head": True} if new.tied else {})}}
