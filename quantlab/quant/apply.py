"""``quantize_(model, fmt)``: apply a weight format to a model in place."""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any, Iterable

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


def head_format(fmt: WeightFormat, head: str) -> WeightFormat | None:
    """The format an override gives the output head ``head`` (a module name), or None: the head is kept.

    The default selection leaves the head out; an override whose globs match it takes it in (as GPTQModel's
    ``lm_head`` option and llama.cpp's quantized output matrix do); ``quantize_`` refuses a calibrated one.
    """
    if not any(fnmatch(head, p) for o in fmt.overrides for p in o.modules):
        return None
    return fmt.format_for(head)  # the format's include / exclude still apply


def select_linears(
    model: nn.Module, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> tuple[list[str], list[str]]:
    """Split linear modules into (selected, kept) by glob patterns on their qualified names."""
    exclude = list(default_exclude(model) if exclude is None else exclude)
    include = list(include or ["*"])
    selected, kept = [], []
    for name, module in model.named_modules():
        if not isinstance(module, linear_types()):
            continue
        chosen = any(fnmatch(name, p) for p in include) and not any(fnmatch(name, p) for p in exclude)
        (selected if chosen else kept).append(name)
    return selected, kept


def quantize_(
    model: nn.Module,
    fmt: WeightFormat,
    calibration: Calibration | list[torch.Tensor] | None = None,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> QuantizeReport:
    """Apply ``fmt`` to ``model`` in place.

    ``calibration``: token-id tensors ``[1, seq]`` (or a ``Calibration``) for formats that need them.
    By default every linear layer is quantized except the output embedding (unless one of the format's
    overrides names it, e.g. ``lm_head``); embeddings and norms stay in the base dtype. ``include`` / ``exclude`` are
    glob patterns on module names (e.g. ``"*.mlp.*"``) that override this; the format's own ``include``,
    ``exclude`` and ``overrides`` then choose among those (overrides are applied first, so a calibrated
    format sees them already quantized).
    """
    if fmt.needs_calibration and calibration is None:
        raise ValueError(f"weight format {fmt.label} needs calibration data (a list of token-id tensors)")
    if calibration is not None and not isinstance(calibration, Calibration):
        calibration = Calibration(list(calibration))
    fmt.prepare_model_(model)
    heads = default_exclude(model) if exclude is None else []
    selected, kept = select_linears(model, include, heads if exclude is None else exclude)
    for head in heads:
        found = head_format(fmt, head) if head in kept else None
        if found is not None and found.requires_calibration:
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
