"""Reports rebuilt from a run's results.jsonl and manifest.json."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import QuantlabError
from ..results import MANIFEST_FILE, RESULTS_FILE, atomic_write_text, read_jsonl
from .markdown import render
from .table import comparison, flatten, points_frame


def write_report(out_dir: Path) -> Path:
    """Write report.md and results.csv from the results in ``out_dir``; returns the report path."""
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
    atomic_write_text(out_dir / "results.csv", points.drop(columns=[c for c in points if c.startswith("environment_")]).to_csv(index=False))
    report = out_dir / "report.md"
    atomic_write_text(report, render(frame, rows, manifest))
    return report


__all__ = ["write_report"]
