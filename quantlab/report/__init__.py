"""Reports rebuilt from a run's results.jsonl and manifest.json."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import QuantlabError
from ..results import MANIFEST_FILE, RESULTS_FILE, atomic_write, atomic_write_text, read_jsonl
from .html import render_html
from .markdown import render
from .table import comparison, flatten, points_frame

LIST_COLUMNS = ("decode_ms_samples",)  # kept in results.jsonl, not in the tables


def write_report(out_dir: Path) -> Path:
    """Write report.md, report.html, results.csv and results.parquet from the results in ``out_dir``;
    returns the Markdown report's path."""
    out_dir = Path(out_dir)
    rows = read_jsonl(out_dir / RESULTS_FILE)
    if not rows:
        raise QuantlabError(f"{out_dir / RESULTS_FILE}: no results to report")
    manifest_path = out_dir / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    order = manifest.get("variant_keys")
    if order:
        rank = {k: i for i, k in enumerate(order)}
        rows = sorted(rows, key=lambda r: rank.get(r["variant_key"], len(rank)))
    baseline = manifest.get("baseline") or rows[0]["variant"]
    manifest.setdefault("baseline", baseline)
    frame = comparison(flatten(rows), baseline)
    ratios = [c for c in frame if c.endswith(("_ratio", "_delta"))]
    points = points_frame(rows).merge(frame[["variant", *ratios]], on="variant", how="left")
    table = points.drop(columns=[c for c in points if c.startswith("environment_") or c in LIST_COLUMNS])
    atomic_write_text(out_dir / "results.csv", table.to_csv(index=False))
    write_parquet(table, out_dir / "results.parquet")
    report = out_dir / "report.md"
    atomic_write_text(report, render(frame, rows, manifest))
    atomic_write_text(out_dir / "report.html", render_html(frame, rows, manifest))
    return report


def write_parquet(table: pd.DataFrame, path: Path) -> None:
    """The table as Parquet (columns of mixed or nested values as JSON text), written atomically."""
    frame = table.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].map(lambda v: v if v is None or isinstance(v, str) else json.dumps(v))
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


__all__ = ["write_report"]
