"""``quantlab compare DIR DIR ...``: one report across runs, variants aligned by label.

Typical uses: the same recipe on two machines, or two recipes sharing a baseline.
Each figure of a later run is also given as a ratio to the first run's figure
for the same variant label.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..errors import QuantlabError
from ..eval.perplexity import protocol_of
from ..files import atomic_write_text
from ..measurements import Column
from .table import cell, compare_heading, delta_spec, first_ok, fmt_value, sections


def figures(rows: list[dict[str, Any]]) -> list[Column]:
    """The main table's columns that compare to a reference (ratio or delta), from the measurements' specs."""
    return [c for c in sections(rows)[0].columns if c.compare]


def load_runs(dirs: list[Path]) -> pd.DataFrame:
    """One row per run x variant (its first measurement point), with the run's name and device."""
    from . import load_rows

    frames, names, settings = [], [], []
    for d in dirs:
        rows, manifest = load_rows(Path(d))
        settings.append(run_settings(rows, manifest))
        name = f"{manifest.get('recipe', {}).get('name') or rows[0].get('recipe', '?')} @ {rows[0].get('device', '?')}"
        if name in names:  # same recipe on the same device twice: tell them apart by folder
            name = f"{name} ({Path(d).name})"
        names.append(name)
        frame = pd.DataFrame([{k: v for k, v in r.items() if k not in ("decode_points", "decode_ms_samples", "exports", "divergence_windows")} for r in rows])
        frame.attrs["rows"] = rows
        frame.insert(0, "run", name)
        frame.insert(1, "run_dir", str(d))
        frame.insert(2, "align", [_alignment_key(r) for r in rows])
        frames.append(frame)
    runs = pd.concat(frames, ignore_index=True)
    runs.attrs["figures"] = figures([r for f in frames for r in f.attrs["rows"]])
    runs.attrs["differences"] = differences(settings)
    return runs


def run_settings(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> dict[str, Any]:
    """What must match for two runs' figures to be comparable: the workload and the perplexity protocol."""
    first = first_ok(rows)
    w = (manifest.get("recipe") or {}).get("workload") or {}
    proto = first.get("perplexity_protocol") or {}
    return {
        "workload.batch_size": w.get("batch_size", first.get("batch_size")),
        "workload.prompt_tokens": w.get("prompt_tokens", first.get("prompt_tokens")),
        "workload.new_tokens": w.get("new_tokens", first.get("new_tokens")),
        "workload.engine": w.get("engine", first.get("engine")),
        "perplexity protocol": protocol_of(proto).comparison_key(proto) if proto else None,
    }


def differences(settings: list[dict[str, Any]]) -> list[str]:
    """One line per setting that differs between runs, with each run's value."""
    out = []
    for key in settings[0]:
        values = [s.get(key) for s in settings]
        if any(v != values[0] for v in values):
            out.append(f"{key} differs: " + "; ".join(f"[{i + 1}] {v}" for i, v in enumerate(values)))
    return out


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
        for fig in runs.attrs["figures"]:
            col = fig.field
            values = [float(part[col][v]) if v in part.index and col in part and ok[v] else math.nan for v in order]
            out[f"{col}@{run}"] = values
            if run != first:
                base = out[f"{col}@{first}"]
                out[f"{col}_vs_first@{run}"] = (pd.Series(values) / base) if fig.compare == "ratio" else (pd.Series(values) - base)
    out.attrs["figures"] = runs.attrs["figures"]
    out.attrs["differences"] = runs.attrs.get("differences", [])
    return out


Section = tuple[str, list[str], list[list[str]]]  # heading, header, rows of formatted cells


def heading_of(fig: Column) -> str:
    return fig.heading.split(" (")[0]


def _sections(table: pd.DataFrame, run_names: list[str]) -> list[Section]:
    """One table per figure that any run has: each run's value, then later runs against the first."""
    out = []
    for fig in table.attrs["figures"]:
        col = fig.field
        if all(table[f"{col}@{r}"].isna().all() for r in run_names):
            continue
        header = ["variant"] + [f"{fig.heading} [{i + 1}]" for i in range(len(run_names))]
        header += [f"{compare_heading(fig, '[1]').split()[0]} [{i + 1}] vs [1]" for i in range(1, len(run_names))]
        rows = []
        plain = Column(col, fig.heading, fig.spec, fig.divide_by)  # the value alone, without its spread
        for _, r in table.iterrows():
            cells = [r["variant"]] + [cell(lambda f, n=n: r[f"{f}@{n}"], plain) for n in run_names]
            cells += [fmt_value(r[f"{col}_vs_first@{n}"], ".3f" if fig.compare == "ratio" else delta_spec(fig)) for n in run_names[1:]]
            rows.append(cells)
        out.append((heading_of(fig), header, rows))
    return out


def _not_measured(table: pd.DataFrame, run_names: list[str]) -> str | None:
    missing = [(r["variant"], n, r[f"status@{n}"]) for _, r in table.iterrows() for n in run_names if r[f"status@{n}"] != "ok"]
    if not missing:
        return None
    return "Not measured: " + "; ".join(f"{v} in [{run_names.index(n) + 1}] ({s})" for v, n, s in missing) + "."


def render_markdown(table: pd.DataFrame, run_names: list[str], dirs: list[Path]) -> str:
    lines = ["# quantlab comparison", "", "Runs (the first is the reference for ratios and deltas):", ""]
    lines += [f"{i + 1}. **{n}** — `{d}`" for i, (n, d) in enumerate(zip(run_names, dirs))]
    if table.attrs.get("differences"):
        lines += ["", "**The runs differ in settings that change the figures**, so ratios mix those changes in:", ""]
        lines += [f"- {d}" for d in table.attrs["differences"]]
    for heading, header, rows in _sections(table, run_names):
        lines += ["", f"## {heading}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    missing = _not_measured(table, run_names)
    if missing:
        lines += ["", missing]
    return "\n".join(lines) + "\n"


def _plot(table: pd.DataFrame, run_names: list[str]) -> str | None:
    from .plots import STYLE, plt, to_svg

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
        return to_svg(fig)


def render_html(table: pd.DataFrame, run_names: list[str], dirs: list[Path]) -> str:
    """The same tables as ``render_markdown``, with the speed plot, as one self-contained page."""
    from .html import CSS, esc, html_table

    body = ["<h1>quantlab comparison</h1>", "<p>Runs (the first is the reference for ratios and deltas):</p><ol>"]
    body += [f"<li><b>{esc(n)}</b> — <code>{esc(d)}</code></li>" for n, d in zip(run_names, dirs)]
    body.append("</ol>")
    if table.attrs.get("differences"):
        body.append('<div class="banner"><b>The runs differ in settings that change the figures</b>, so ratios mix '
                    "those changes in:<ul>" + "".join(f"<li>{esc(d)}</li>" for d in table.attrs["differences"]) + "</ul></div>")
    for heading, header, rows in _sections(table, run_names):
        body += [f"<h2>{esc(heading)}</h2>", html_table([esc(h) for h in header], [([esc(c) for c in cells], "") for cells in rows])]
    missing = _not_measured(table, run_names)
    if missing:
        body.append(f"<p>{esc(missing)}</p>")
    plot = _plot(table, run_names)
    if plot:
        body.append(f'<figure id="plot-compare-speed">{plot}<figcaption>Decode tokens/s by variant and run.</figcaption></figure>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>quantlab comparison</title>'
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")


def compare_runs(dirs: list[Path], out_dir: Path, log: Callable[[str], None] | None = None) -> Path:
    """Write compare.md, compare.html and compare.csv (long: one row per run x variant) to ``out_dir``."""
    if len(dirs) < 2:
        raise QuantlabError("compare needs at least two result folders")
    for d in dirs:
        if not Path(d).is_dir():
            raise QuantlabError(f"{d}: no such results folder")
    seen: set[Path] = set()
    for d in dirs:
        if Path(d).resolve() in seen and log is not None:
            log(f"warning: {d} is given twice: its runs are compared with themselves")
        seen.add(Path(d).resolve())
    runs = load_runs(dirs)
    run_names = list(dict.fromkeys(runs["run"]))
    table = aligned(runs)
    for line in table.attrs["differences"]:
        if log is not None:
            log(f"warning: {line}")
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "compare.md", render_markdown(table, run_names, dirs))
    atomic_write_text(out_dir / "compare.html", render_html(table, run_names, dirs))
    atomic_write_text(out_dir / "compare.csv", runs.drop(columns=[c for c in runs if c == "environment"]).to_csv(index=False))
    return out_dir / "compare.md"
