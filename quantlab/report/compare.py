"""``quantlab compare DIR DIR ...``: one report across runs, variants aligned by label.

Typical uses: the same recipe on two machines, or two recipes sharing a baseline.
Each figure of a later run is also given as a ratio to the first run's figure
for the same variant label.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import QuantlabError
from ..results import MANIFEST_FILE, RESULTS_FILE, atomic_write_text, read_jsonl
from .table import MIB

FIGURES = [  # column, heading, format, comparison to the first run: "ratio" or "delta"
    ("weight_bytes", "weights MiB", ".3f", "ratio"),
    ("peak_memory_bytes", "peak MiB", ".1f", "ratio"),
    ("tokens_per_s", "tokens/s", ".1f", "ratio"),
    ("perplexity", "perplexity", ".3f", "delta"),
]


def load_runs(dirs: list[Path]) -> pd.DataFrame:
    """One row per run x variant (its first measurement point), with the run's name and device."""
    frames, names = [], []
    for d in dirs:
        rows = read_jsonl(Path(d) / RESULTS_FILE)
        if not rows:
            raise QuantlabError(f"{Path(d) / RESULTS_FILE}: no results to compare")
        manifest_path = Path(d) / MANIFEST_FILE
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        name = f"{manifest.get('recipe', {}).get('name') or rows[0].get('recipe', '?')} @ {rows[0].get('device', '?')}"
        if name in names:  # same recipe on the same device twice: tell them apart by folder
            name = f"{name} ({Path(d).name})"
        names.append(name)
        frame = pd.DataFrame([{k: v for k, v in r.items() if k not in ("decode_points", "decode_ms_samples")} for r in rows])
        frame.insert(0, "run", name)
        frame.insert(1, "run_dir", str(d))
        frame.insert(2, "align", [_alignment_key(r) for r in rows])
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _alignment_key(row: dict[str, Any]) -> str:
    """The full label, weight format and KV format: a run with one KV format labels its variants by the weight
    format alone (``int8``), another with several as ``int8/kv-native``; both mean the same variant."""
    if row.get("weight_format") and row.get("kv_format"):
        return f"{row['weight_format']}/kv-{row['kv_format']}"
    return str(row["variant"])


def aligned(runs: pd.DataFrame) -> pd.DataFrame:
    """Variants (rows, in order of first appearance, matched on weight and KV format) x run figures (columns ``<figure>@<run>``), with
    ``<figure>_vs_first@<run>`` against the first run; a variant missing from a run is NaN there."""
    order = list(dict.fromkeys(runs["align"]))
    shortest = {k: min(runs.loc[runs["align"] == k, "variant"], key=len) for k in order}
    run_names = list(dict.fromkeys(runs["run"]))
    out = pd.DataFrame({"variant": [shortest[k] for k in order]})
    first = run_names[0]
    for run in run_names:
        part = runs[(runs["run"] == run)].set_index("align")
        ok = part["status"] == "ok" if "status" in part else pd.Series(True, index=part.index)
        out[f"status@{run}"] = [part["status"][v] if v in part.index else "absent" for v in order]
        for col, _, _, how in FIGURES:
            values = [float(part[col][v]) if v in part.index and col in part and ok[v] else math.nan for v in order]
            out[f"{col}@{run}"] = values
            if run != first:
                base = out[f"{col}@{first}"]
                out[f"{col}_vs_first@{run}"] = (pd.Series(values) / base) if how == "ratio" else (pd.Series(values) - base)
    return out


def _fmt(x: Any, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _value(col: str, x: float) -> float:
    return x / MIB if col.endswith("_bytes") else x


def render_markdown(table: pd.DataFrame, run_names: list[str], dirs: list[Path]) -> str:
    lines = ["# quantlab comparison", "", "Runs (the first is the reference for ratios and deltas):", ""]
    lines += [f"{i + 1}. **{n}** — `{d}`" for i, (n, d) in enumerate(zip(run_names, dirs))]
    for col, heading, fmt, how in FIGURES:
        if all(table[f"{col}@{r}"].isna().all() for r in run_names):
            continue
        head = ["variant"] + [f"{heading} [{i + 1}]" for i in range(len(run_names))]
        head += [f"{'×' if how == 'ratio' else 'Δ'} [{i + 1}] vs [1]" for i in range(1, len(run_names))]
        lines += ["", f"## {heading}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, r in table.iterrows():
            cells = [r["variant"]] + [_fmt(_value(col, r[f"{col}@{n}"]), fmt) for n in run_names]
            cells += [_fmt(r[f"{col}_vs_first@{n}"], ".3f" if how == "ratio" else "+.3f") for n in run_names[1:]]
            lines.append("| " + " | ".join(cells) + " |")
    missing = [(r["variant"], n, r[f"status@{n}"]) for _, r in table.iterrows() for n in run_names if r[f"status@{n}"] != "ok"]
    if missing:
        lines += ["", "Not measured: " + "; ".join(f"{v} in [{run_names.index(n) + 1}] ({s})" for v, n, s in missing) + "."]
    return "\n".join(lines) + "\n"


def _plot(table: pd.DataFrame, run_names: list[str]) -> str | None:
    from .plots import STYLE, _svg, plt

    if all(table[f"tokens_per_s@{r}"].isna().all() for r in run_names):
        return None
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(table) * max(1, len(run_names)) / 2 + 1.5))
        height = 0.8 / len(run_names)
        for i, run in enumerate(run_names):
            ys = [y + i * height for y in range(len(table))]
            ax.barh(ys, table[f"tokens_per_s@{run}"].fillna(0), height=height, label=f"[{i + 1}] {run}")
        ax.set_yticks([y + 0.4 - height / 2 for y in range(len(table))], list(table["variant"]))
        ax.invert_yaxis()
        ax.set_xlabel("decode tokens/s (first point of each run)")
        ax.legend(frameon=False, fontsize=7)
        return _svg(fig)


def render_html(markdown: str, plot: str | None) -> str:
    """The Markdown tables as HTML (a small converter for the subset written above) with the plot."""
    from .html import CSS

    body, in_table = [], False
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-"):
                continue
            tag = "th" if not in_table else "td"
            body.append(("<table>" if not in_table else "") + "<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            in_table = True
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.strip():
            body.append(f"<p>{html.escape(line).replace('**', '')}</p>")
    if in_table:
        body.append("</table>")
    figure = f'<figure id="plot-compare-speed">{plot}<figcaption>Decode tokens/s by variant and run.</figcaption></figure>' if plot else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>quantlab comparison</title>'
            f"<style>{CSS}</style></head><body>{''.join(body)}{figure}</body></html>\n")


def compare_runs(dirs: list[Path], out_dir: Path) -> Path:
    """Write compare.md, compare.html and compare.csv (long: one row per run x variant) to ``out_dir``."""
    if len(dirs) < 2:
        raise QuantlabError("compare needs at least two result folders")
    for d in dirs:
        if not Path(d).is_dir():
            raise QuantlabError(f"{d}: no such results folder")
    runs = load_runs(dirs)
    run_names = list(dict.fromkeys(runs["run"]))
    table = aligned(runs)
    markdown = render_markdown(table, run_names, dirs)
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "compare.md", markdown)
    atomic_write_text(out_dir / "compare.html", render_html(markdown, _plot(table, run_names)))
    atomic_write_text(out_dir / "compare.csv", runs.drop(columns=[c for c in runs if c == "environment"]).to_csv(index=False))
    return out_dir / "compare.md"
