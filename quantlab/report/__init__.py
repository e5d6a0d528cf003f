"""Views of a run folder, rebuilt from its per-variant records: results.jsonl, results.csv, results.parquet,
report.md, report.html and manifest.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..errors import QuantlabError
from ..files import MANIFEST_FILE, RESULTS_FILE, atomic_write, atomic_write_text
from ..measurements import all_measurements
from ..records.folder import RunFolder
from ..records.views import IDENTITY, RUN_FIELDS, flat_row, leave_out_unread_kv
from .headline import Headline, headline
from .html import render_html
from .markdown import render
from .summary import Summary, noisy_banner, rerun_sentence, summary
from .table import compared_columns, comparison, flatten, pareto_variants, points_frame
from .terminal import summary_text

LIST_COLUMNS = ("decode_ms_samples",)  # kept in results.jsonl, not in the tables


def load_rows(out_dir: Path, log: Callable[[str], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The flat rows of a run folder in recipe order (converting an older results.jsonl folder first), and its
    manifest with ``complete`` set from the records."""
    folder = RunFolder(out_dir)
    folder.convert_legacy(log or (lambda _: None))
    records = folder.records()
    manifest_path = Path(out_dir) / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    order = manifest.get("variant_keys") or list(records)
    rows = [flat_row(records[k], str(folder.record_path(k))) for k in order if k in records]
    if not rows:
        raise QuantlabError(f"{folder.records_dir}: no results to report")
    manifest["complete"] = all(k in records for k in order)
    manifest.setdefault("baseline", rows[0]["variant"])
    leave_out_unread_kv(rows, manifest["baseline"])
    return rows, manifest


def csv_columns(table: pd.DataFrame, rows: list[dict[str, Any]]) -> list[str]:
    """Identity first, then each measurement's fields and its ratios in registration order, then the run's fields."""
    order = [*IDENTITY, "batch_size", "prompt_tokens"]
    for _, m in all_measurements():
        fields = list(m.result.model_fields) + [c.compare_field for c in m.columns_for(rows) if c.compare]
        for f in fields:
            order += [c for c in table.columns if c == f or c.startswith(f"{f}_")]
    order += [c for c in table.columns if c in RUN_FIELDS or c.startswith("lm_eval_")]
    seen: list[str] = []
    for c in [*order, *table.columns]:
        if c in table.columns and c not in seen and not c.startswith("environment_") and c not in LIST_COLUMNS:
            seen.append(c)
    return seen


def write_report(out_dir: Path, log: Callable[[str], None] | None = None) -> Path:
    """Rebuild every view of ``out_dir`` from its records; returns the Markdown report's path."""
    out_dir = Path(out_dir)
    rows, manifest = load_rows(out_dir, log)
    baseline = manifest["baseline"]
    frame = comparison(flatten(rows), baseline, rows)
    compared = [c.compare_field for c in compared_columns(rows) if c.compare_field in frame]
    points = points_frame(rows).merge(frame[["variant", *compared]], on="variant", how="left")
    table = points[csv_columns(points, rows)]
    atomic_write_text(out_dir / RESULTS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(out_dir / "results.csv", table.to_csv(index=False))
    write_parquet(table, out_dir / "results.parquet")
    head, table, banner = answer(out_dir, rows, manifest, frame)
    report = out_dir / "report.md"
    atomic_write_text(report, render(frame, rows, manifest, head, table, banner))
    atomic_write_text(out_dir / "report.html", render_html(frame, rows, manifest, head, table, banner))
    atomic_write_text(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=1))
    return report


def answer(out_dir: Path, rows: list[dict[str, Any]], manifest: dict[str, Any],
           frame: pd.DataFrame | None = None) -> tuple[Headline, Summary, str | None]:
    """The headline, the summary table and the noisy-timing banner of a run's rows (what every view opens with)."""
    if frame is None:
        frame = comparison(flatten(rows), manifest["baseline"], rows)
    rerun = rerun_sentence(manifest, str(out_dir))
    head = headline(rows, manifest, rerun)
    return head, summary(rows, manifest["baseline"], pareto_variants(frame)), noisy_banner(rows, rerun)


def write_parquet(table: pd.DataFrame, path: Path) -> None:
    """The table as Parquet (columns of mixed or nested values as JSON text), written atomically."""
    frame = table.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].map(lambda v: v if v is None or isinstance(v, str) else json.dumps(v))
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def run_summary(out_dir: Path) -> str:
    """The answer's rows and where the reports and exports are (``quantlab run``'s last lines)."""
    rows, manifest = load_rows(out_dir)
    head, _, _ = answer(out_dir, rows, manifest)
    return summary_text(out_dir, rows, manifest, head)


__all__ = ["answer", "load_rows", "run_summary", "write_report"]
