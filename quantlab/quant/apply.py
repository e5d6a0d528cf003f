"""``quantize_(model, fmt)``: apply a weight format to a model in place."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .format import Calibration, WeightFormat
from .linear import linear_types


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
    for key in sorted(assigned, key=lambda k: k == ""):  # the overrides, then the entry's own format
        found = formats[key].apply_(model, assigned[key], calibration)
        details.update({n: {**d, "format": formats[key].scheme_label} if fmt.overrides else d for n, d in found.items()})
    kept += [name for names in assigned.values() for name in names if name not in details]
    return QuantizeReport(replaced=list(details), kept=kept, details=details)
