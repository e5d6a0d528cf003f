"""Whether two variants' figures differ, from the same windows scored by both: a paired bootstrap (windows
resampled with replacement, the same resample for both variants), so what the windows share — the text's hard and
easy passages — cancels, and only the variants' difference is left."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, perplexity: bool = False,
                     resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> dict[str, Any]:
    """The difference ``statistic(a) − statistic(b)`` over paired per-window values with its bootstrap interval at
    ``level``: the statistic is the mean (per-window mean KL), or with ``perplexity`` exp of the mean (per-window
    mean negative log-likelihood, windows of equal length). ``distinguishable``: the interval excludes 0."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"paired values need the same windows, at least two: got {x.size} and {y.size}")

    def stat(v: np.ndarray) -> np.ndarray:
        m = v.mean(axis=-1)
        return np.exp(m) if perplexity else m

    picks = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    diffs = stat(x[picks]) - stat(y[picks])
    low, high = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    diff = float(stat(x) - stat(y))
    return {"difference": diff, "low": float(low), "high": float(high), "windows": int(x.size),
            "distinguishable": bool(not (low <= 0 <= high)) and not math.isnan(diff)}
