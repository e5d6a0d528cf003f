"""The divergence figures split by the baseline's confidence: KL and Δp over the positions where the baseline gives
its own most likely token a probability below 0.5, from 0.5 to 0.9, and 0.9 or more (as exllamav3's qbench splits
KLD), derived from the divergence record's ``confidence_splits``."""
from __future__ import annotations

from typing import Any

from ..fidelity.statistics import CONFIDENCE_EDGES, split_bounds
from .base import Column, Measurement, Result, register

LOW, HIGH = CONFIDENCE_EDGES
SPLITS = dict(zip(("low", "mid", "high"), split_bounds()))  # column key -> the records' split name
HEADINGS = {"low": f"p(top) under {LOW:g}", "mid": f"p(top) {LOW:g} to {HIGH:g}", "high": f"p(top) {HIGH:g}+"}


class ConfidenceSplits(Result):
    confidence_low_share_percent: float
    confidence_low_kl_mean: float | None = None
    confidence_low_kl_p99: float | None = None
    confidence_low_delta_p_rms_percent: float | None = None
    confidence_mid_share_percent: float
    confidence_mid_kl_mean: float | None = None
    confidence_mid_kl_p99: float | None = None
    confidence_mid_delta_p_rms_percent: float | None = None
    confidence_high_share_percent: float
    confidence_high_kl_mean: float | None = None
    confidence_high_kl_p99: float | None = None
    confidence_high_delta_p_rms_percent: float | None = None


def _columns() -> tuple[Column, ...]:
    found = []
    for key, where in HEADINGS.items():
        found += [Column(f"confidence_{key}_share_percent", f"{where}: positions %", ".1f"),
                  Column(f"confidence_{key}_kl_mean", f"{where}: KL mean", ".5f", higher_is_better=False),
                  Column(f"confidence_{key}_kl_p99", f"{where}: KL p99", ".4f", higher_is_better=False),
                  Column(f"confidence_{key}_delta_p_rms_percent", f"{where}: RMS Δp %", ".3f", higher_is_better=False)]
    return tuple(found)


@register("confidence_splits", "KL and Δp split by the baseline's probability of its own top token")
class Confidence(Measurement):
    order = 91
    result = ConfidenceSplits
    derived = True
    title = "divergence by the baseline's confidence"
    section = "Divergence by the baseline's confidence"
    columns = _columns()

    def derive(self, row: dict[str, Any]) -> ConfidenceSplits | None:
        splits = row.get("confidence_splits")
        if not splits:
            return None
        figures: dict[str, Any] = {}
        for key, name in SPLITS.items():
            s = splits.get(name) or {}
            figures[f"confidence_{key}_share_percent"] = s.get("share_percent", 0.0)
            figures[f"confidence_{key}_kl_mean"] = s.get("kl_mean")
            figures[f"confidence_{key}_kl_p99"] = s.get("kl_p99")
            figures[f"confidence_{key}_delta_p_rms_percent"] = s.get("delta_p_rms_percent")
        return ConfidenceSplits(**figures)

    def reads_kv_cache(self, row: dict[str, Any]) -> bool | None:
        return False  # whole windows through the model, like the divergence it splits

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        return (f"the divergence positions grouped by the baseline's probability of its own most likely token "
                f"(below {LOW:g}, {LOW:g} to {HIGH:g}, {HIGH:g} and above): each group's share of the positions, its "
                "mean and p99 KL and its RMS Δp.")
