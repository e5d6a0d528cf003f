"""The tables every view shares: flat rows as frames, ratios to the baseline, and cells formatted from the
registered measurements' column specs (Markdown, HTML, CSV and ``quantlab compare`` all use these)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..measurements import Column, all_measurements
from .pareto import pareto_front

MIB = 1 << 20


def missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def flag(x: Any) -> bool:
    """A boolean field of a row, read from a dict or a frame (missing and NaN: False)."""
    return not missing(x) and bool(x)


def fmt_value(x: Any, spec: str) -> str:
    """``x`` formatted with ``spec``; a dash for a missing value (None or NaN)."""
    if missing(x):
        return "—"
    if spec == "":
        return str(x)
    if spec == "," and isinstance(x, float) and x.is_integer():
        x = int(x)  # byte counts read back through a float column
    return format(x, spec)


def cell(get: Any, col: Column) -> str:
    """One column's value of a row (``get``: the row's ``get``), scaled, formatted, with its spread."""
    value = get(col.field)
    scaled = value / col.divide_by if col.divide_by != 1 and not missing(value) else value
    text = fmt_value(scaled, col.spec)
    if col.spread and not missing(value):
        lo, hi = (get(f) for f in col.spread)
        text += f" ({fmt_value(lo, col.spec)}–{fmt_value(hi, col.spec)})"
    return text


def delta_spec(col: Column) -> str:
    """A delta in the column's own precision, signed."""
    return "+" + (col.spec if col.spec and col.spec[0] == "." else ".3f")


def compare_cell(get: Any, col: Column) -> str:
    return fmt_value(get(col.compare_field), ".3f" if col.compare == "ratio" else delta_spec(col))


def compare_heading(col: Column, against: str = "base") -> str:
    return f"× {against}" if col.compare == "ratio" else f"Δ {against}"


@dataclass
class Section:
    """A table of a report: which measurement columns it shows."""

    heading: str | None  # None: the main table
    columns: list[Column]


def _present(places: list[dict[str, Any]], cols: list[Column]) -> bool:
    """Whether any of ``places`` (measured rows, or their decode points) has a value for any of ``cols``."""
    return any(not missing(p.get(c.field)) for p in places for c in cols)


def sections(rows: list[dict[str, Any]]) -> list[Section]:
    """The main table's columns and each sectioned measurement's own table, for the measurements these rows have."""
    ok = [r for r in rows if r.get("status") == "ok"]
    main = Section(None, [])
    out = [main]
    for _, m in all_measurements():
        cols = m.columns_for(rows)
        if not cols or not _present(ok, cols):
            continue
        if m.section:
            out.append(Section(m.section, cols))
        else:
            main.columns += [c for c in cols if c.summary]
    return out


def point_section(rows: list[dict[str, Any]]) -> Section:
    """Every per-point column (summary or not) that the measured rows' decode points have: the decode table."""
    points = [p for r in rows if r.get("status") == "ok" for p in r.get("decode_points") or []]
    section = Section(None, [])
    for _, m in all_measurements():
        cols = m.columns_for(rows)
        if m.scope == "point" and _present(points, cols):
            section.columns += cols
    return section


def header(section: Section, compare: bool = True) -> list[str]:
    out = []
    for col in section.columns:
        out.append(col.heading)
        if col.compare and compare:
            out.append(compare_heading(col))
    return out


class Struck(str):
    """A cell's text that the views show struck through (a timing taken on a noisy machine)."""


def cells(get: Any, section: Section, compare: bool = True) -> list[str]:
    """The row's cells for ``section``. Where the row's timing is noisy, a timing column's value is ``Struck`` (or
    blank, as the column says) and its ratio to the baseline blank."""
    noisy = flag(get("noisy"))
    out: list[str] = []
    for col in section.columns:
        text = cell(get, col)
        if noisy and col.timing == "blank":
            text = ""
        elif noisy and col.timing == "strike" and text != "—":
            text = Struck(text)
        out.append(text)
        if col.compare and compare:
            out.append("" if noisy and col.timing else compare_cell(get, col))
    return out


def first_ok(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The first measured row (the one whose settings describe the run), else the first row."""
    return next((r for r in rows if r.get("status") == "ok"), rows[0] if rows else {})


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The variants that were measured (status ok)."""
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A column, or NaN for every row where no row has it."""
    return frame[name] if name in frame else pd.Series([math.nan] * len(frame), index=frame.index)


def footprint_bytes(frame: pd.DataFrame) -> pd.Series:
    """Weights + KV cache at the first decode point: the bytes a deployment holds for the model."""
    return column(frame, "weight_bytes").astype(float) + column(frame, "kv_cache_bytes").fillna(0).astype(float)


def has_metric(frame: pd.DataFrame, metric: str = "perplexity") -> bool:
    """Whether any measured variant has a value of ``metric`` (perplexity, mean KL divergence)."""
    ok = measured(frame)
    return metric in ok and not ok[metric].isna().all()


def pareto_variants(frame: pd.DataFrame, metric: str = "perplexity") -> dict[str, bool]:
    """For each measured variant, whether it is on the Pareto front of ``metric`` against footprint bytes."""
    ok = measured(frame)
    return dict(zip(ok["variant"], pareto_front(list(footprint_bytes(ok)), list(column(ok, metric).astype(float)))))


def flatten(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per variant (its first measurement point), nested records as ``parent_child`` columns."""
    return pd.json_normalize([{k: v for k, v in r.items() if k not in ("decode_points", "exports", "divergence_windows")} for r in rows],
                             sep="_")


def points_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per variant x decode measurement point (batch size, prompt length)."""
    exploded = []
    for r in rows:
        base = {k: v for k, v in r.items() if k != "decode_points"}
        exploded += [{**base, **point} for point in r.get("decode_points") or [{}]]
    return pd.json_normalize(exploded, sep="_")


def order_baseline_first(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    first = frame["variant"] == baseline
    return pd.concat([frame[first], frame[~first]], ignore_index=True)


def compared_columns(rows: list[dict[str, Any]]) -> list[Column]:
    """Every column with a ratio or delta to the baseline, of the measurements these rows have."""
    return [c for _, m in all_measurements() for c in m.columns_for(rows) if c.compare]


def comparison(frame: pd.DataFrame, baseline: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Add ``<field>_ratio`` / ``<field>_delta`` against the baseline row (NaN when the baseline failed)."""
    frame = order_baseline_first(frame, baseline)
    base = frame[(frame["variant"] == baseline) & (frame["status"] == "ok")]
    out = frame.copy()
    for col in compared_columns(rows):
        if col.field not in out:
            continue
        values = pd.to_numeric(out[col.field], errors="coerce")
        ref = float(pd.to_numeric(base[col.field], errors="coerce").iloc[0]) if len(base) else math.nan
        if col.timing and len(base) and "noisy" in base and flag(base["noisy"].iloc[0]):
            ref = math.nan  # a ratio to a timing taken on a noisy machine says nothing
        out[col.compare_field] = values / ref if col.compare == "ratio" else values - ref
    return out
