"""``quantlab sensitivity``: how much each part of a model minds being quantized.

One group of linears at a time (a decoder layer, a module type across layers, or one module) is put in a format,
everything else left as the recipe's baseline, and the KL divergence from the baseline is measured on windows of
the recipe's calibration text (``measure.module_sensitivity.scan``: the layers before a group replayed from the
reference pass, a calibrated format solved once). The same table is what the ``mixed`` weight format chooses
from, so ``sensitivity.csv`` can be its ``sensitivity_path``.

Each measured row is appended to ``sensitivity.jsonl`` as it comes; an interrupted sweep resumes from those rows
(rows measured under another text, token count, baseline or granularity are measured again). The ranked table
(``sensitivity.csv``, ``sensitivity.md``) and a heatmap of layers × module types per format
(``sensitivity.svg``) are written at the end.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import QuantlabError
from ..files import atomic_write_text, read_jsonl
from ..quant import WeightFormat
from ..quant.mixed.groups import Granularity, ModuleGroup, group_linears

ROWS_FILE = "sensitivity.jsonl"


def module_groups(model_spec: Any, granularity: Granularity) -> list[ModuleGroup]:
    """The groups of the model's default-selected linears, from its config (no weights read)."""
    from ..models import load_config, meta_model
    from ..quant.apply import select_linears

    model = meta_model(load_config(model_spec), model_spec.trust_remote_code)
    return group_linears(model, select_linears(model)[0], granularity)


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, most sensitive (largest mean KL) first."""
    return sorted(rows, key=lambda r: -r["kl_divergence_mean"])


def _earlier_rows(path: Path, stamp: dict[str, Any], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Rows an earlier, interrupted sweep measured under the same stamp. The file is written back whole without a
    torn last line (a write cut short), so that rows appended from here on start on a line of their own."""
    rows = read_jsonl(path, log)
    if path.exists():
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    return [row for row in rows if row.get("stamp") == stamp]


def _fits_beside(fmt: WeightFormat, baseline: WeightFormat, base: Any) -> bool:
    """Whether ``fmt``'s linears can be swapped into the baseline one group at a time: the same compute dtype and
    the default module selection."""
    return fmt.unquantized_dtype(base) == baseline.unquantized_dtype(base) and fmt.is_plain


def beside_baseline(recipe: Any) -> list[WeightFormat]:
    """The recipe's weight formats (besides the baseline) that a sensitivity scan can put beside the baseline."""
    from ..dtypes import DTYPES
    from ..models import load_config, model_dtype_name

    baseline = recipe.baseline_variant.weight
    base = DTYPES[model_dtype_name(recipe.model, load_config(recipe.model))]
    return [w for w in recipe.weights if w != baseline and _fits_beside(w, baseline, base)]


@dataclass
class SensitivityTable:
    """A finished sweep: its rows ranked, most sensitive first, and how they were scored (``report.sensitivity``
    writes sensitivity.md, .csv and .svg from it)."""

    rows: list[dict[str, Any]]
    formats: list[str]
    granularity: str
    stamp: dict[str, Any]
    kinds: list[str | None]


def run_sensitivity(recipe: Any, formats: list[WeightFormat], granularity: Granularity, out: Path, max_tokens: int,
                    log: Callable[[str], None]) -> SensitivityTable:
    from ..data import token_ids_sha256
    from ..dtypes import DTYPES
    from ..models import load_config, model_dtype_name
    from ..quant.apply import select_linears
    from ..quant.mixed.sensitivity import scan, scan_samples
    from .lifecycle import load_unquantized_baseline

    baseline = recipe.baseline_variant.weight
    base = DTYPES[model_dtype_name(recipe.model, load_config(recipe.model))]  # the dtype the model loads in
    for f in formats:
        if not _fits_beside(f, baseline, base):
            raise QuantlabError(f"{recipe.source}: sensitivity puts {f.label} beside the baseline {baseline.label}: "
                                "it needs the baseline's compute dtype and no include, exclude or overrides")
    loaded, calibration = load_unquantized_baseline(recipe, "sensitivity needs")
    samples = scan_samples(calibration, max_tokens)
    window = samples[0].shape[-1]
    stamp = {"baseline": baseline.label, "granularity": granularity, "text": str(recipe.calibration.text),
             "window_tokens": window, "scored_tokens": len(samples) * (window - 1), "seed": recipe.calibration.seed,
             "text_sha256": token_ids_sha256(torch.cat([s.reshape(-1) for s in samples]))}
    groups = group_linears(loaded.model, select_linears(loaded.model)[0], granularity)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / ROWS_FILE
    earlier = _earlier_rows(rows_path, stamp, log)
    wanted = {(g.name, f.scheme_label) for g in groups for f in formats}
    rows = [r for r in earlier if (r["group"], r["format"]) in wanted]
    if rows:
        log(f"resuming: {len(rows)} of {len(wanted)} rows measured earlier ({rows_path})")

    def append(row: dict[str, Any]) -> None:
        with open(rows_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({**row, "stamp": stamp}) + "\n")
            f.flush()

    done = {(r["group"], r["format"]) for r in rows}
    if len(done) < len(wanted):
        rows += scan(loaded.model, groups, formats, samples, calibration, done=done, on_row=append)
    table = rank([{k: v for k, v in r.items() if k != "stamp"} for r in rows])
    return SensitivityTable(table, [f.scheme_label for f in formats], granularity, stamp,
                            list(dict.fromkeys(g.kind for g in groups)))
