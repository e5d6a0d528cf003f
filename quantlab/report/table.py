"""The comparison table: one row per variant, baseline first, ratios to the baseline."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .pareto import pareto_front

MIB = 1 << 20


def fmt_value(x: Any, spec: str) -> str:
    """``x`` formatted with ``spec``; a dash for a missing value (None or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if spec == "," and isinstance(x, float) and x.is_integer():
        x = int(x)  # byte counts read back through a float column
    return format(x, spec)


def fmt_mib(x: Any, spec: str = ".3f") -> str:
    """Bytes as MiB; a dash for a missing value."""
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x / MIB, spec)


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


def has_perplexity(frame: pd.DataFrame) -> bool:
    """Whether any measured variant has a perplexity."""
    ok = measured(frame)
    return "perplexity" in ok and not ok["perplexity"].isna().all()


def pareto_variants(frame: pd.DataFrame) -> dict[str, bool]:
    """For each measured variant, whether it is on the Pareto front of perplexity against footprint bytes."""
    ok = measured(frame)
    return dict(zip(ok["variant"], pareto_front(list(footprint_bytes(ok)), list(column(ok, "perplexity").astype(float)))))


def flatten(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per variant (its first measurement point), nested records as ``parent_child`` columns."""
    return pd.json_normalize([{k: v for k, v in r.items() if k != "decode_points"} for r in rows], sep="_")


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


def comparison(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Add ratio columns against the baseline row (NaN when the baseline failed)."""
    frame = order_baseline_first(frame, baseline)
    base = frame[(frame["variant"] == baseline) & (frame["status"] == "ok")]
    out = frame.copy()
    for col, ratio in (("weight_bytes", "weight_bytes_ratio"), ("peak_memory_bytes", "peak_memory_ratio"),
                       ("tokens_per_s", "tokens_per_s_ratio"), ("decode_ms_per_token", "decode_ms_ratio")):
        if col in out:
            out[ratio] = out[col] / base[col].iloc[0] if len(base) else float("nan")
    if "perplexity" in out:
        out["perplexity_delta"] = out["perplexity"] - base["perplexity"].iloc[0] if len(base) else float("nan")
    return out


def task_columns(frame: pd.DataFrame) -> list[str]:
    """Metric columns of lm-eval tasks (``lm_eval_<task>_<metric>``), numeric ones only."""
    return [c for c in frame.columns if c.startswith("lm_eval_") and not c.startswith("lm_eval_tasks")
            and pd.api.types.is_numeric_dtype(frame[c])]


def task_rows(frame: pd.DataFrame, baseline: str) -> tuple[list[str], list[tuple[str, list[float], list[float]]]]:
    """(metric columns, [(variant, values, deltas to the baseline)]) for the measured variants."""
    cols = task_columns(frame)
    ok = measured(frame)
    base = ok[ok["variant"] == baseline]
    out = []
    for _, r in ok.iterrows():
        values = [float(r[c]) for c in cols]
        deltas = [float(r[c]) - float(base[c].iloc[0]) if len(base) else float("nan") for c in cols]
        out.append((r["variant"], values, deltas))
    return cols, out
