"""The noise floor, and paired comparisons along the divergence Pareto front. The floor is the baseline against
itself computed in another dtype (its row's ``noise_floor``); a variant whose mean KL interval (±1.96σ) reaches the
floor's cannot be told from the baseline. Paired comparisons: each variant on the front of mean KL against bytes set
against its neighbour (the next cheaper one on the front), by a paired bootstrap over the windows both scored
(``fidelity.paired``): whether their mean KL and their perplexity differ at 95%. A front point that is not
distinguishable from its neighbour buys its extra bytes (or saves them) for no measurable change."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..fidelity.paired import LEVEL, RESAMPLES, paired_bootstrap
from .table import footprint_bytes, has_metric, measured, pareto_variants


@dataclass(frozen=True)
class Paired:
    variant: str
    neighbour: str
    kl: dict[str, Any]
    perplexity: dict[str, Any]

    @property
    def distinguishable(self) -> bool:
        return self.kl["distinguishable"] or self.perplexity["distinguishable"]

    def text(self) -> str:
        k, p = self.kl, self.perplexity
        verdict = "distinguishable" if self.distinguishable else "not distinguishable"
        return (f"{self.variant} against {self.neighbour}: mean KL {k['difference']:+.5f} "
                f"[{k['low']:+.5f}, {k['high']:+.5f}], perplexity {p['difference']:+.4f} "
                f"[{p['low']:+.4f}, {p['high']:+.4f}]: {verdict}")


def front_neighbours(frame: pd.DataFrame, rows: list[dict[str, Any]]) -> list[Paired]:
    """Each variant on the mean-KL front (by footprint bytes) against the next cheaper one on it, where both
    recorded their per-window figures over the same windows."""
    if not has_metric(frame, "kl_divergence_mean"):
        return []
    ok = measured(frame)
    on = pareto_variants(frame, "kl_divergence_mean")
    order = [v for _, v in sorted(zip(footprint_bytes(ok), ok["variant"])) if on.get(v)]
    windows = {r["variant"]: r.get("divergence_windows") for r in rows if r.get("status") == "ok"}
    found = []
    for cheaper, dearer in zip(order, order[1:]):
        a, b = windows.get(dearer), windows.get(cheaper)
        if not a or not b or len(a["kl_mean"]) != len(b["kl_mean"]) or len(a["kl_mean"]) < 2:
            continue
        found.append(Paired(dearer, cheaper, paired_bootstrap(a["kl_mean"], b["kl_mean"]),
                            paired_bootstrap(a["nll_mean"], b["nll_mean"], perplexity=True)))
    return found


def paired_between(rows: list[dict[str, Any]], first: str, second: str) -> Paired:
    """Any two measured variants of a run (by label), compared over the windows both scored."""
    from ..errors import QuantlabError

    found = {r["variant"]: r for r in rows if r.get("status") == "ok"}
    for name in (first, second):
        if name not in found:
            raise QuantlabError(f"no measured variant {name!r} in this run (measured: {', '.join(found) or 'none'})")
        if not found[name].get("divergence_windows"):
            raise QuantlabError(f"{name}: its record holds no per-window divergence figures (evaluations.divergence, "
                                "measured by this version or later)")
    a, b = found[first]["divergence_windows"], found[second]["divergence_windows"]
    if len(a["kl_mean"]) != len(b["kl_mean"]):
        raise QuantlabError(f"{first} and {second} were scored on different windows ({len(a['kl_mean'])} and "
                            f"{len(b['kl_mean'])})")
    return Paired(first, second, paired_bootstrap(a["kl_mean"], b["kl_mean"]),
                  paired_bootstrap(a["nll_mean"], b["nll_mean"], perplexity=True))


def paired_lines(frame: pd.DataFrame, rows: list[dict[str, Any]]) -> list[str]:
    """The comparisons as sentences, with how they were made; none where nothing could be paired."""
    found = front_neighbours(frame, rows)
    if not found:
        return []
    how = (f"Paired bootstrap over the {found[0].kl['windows']} windows both variants scored ({RESAMPLES:,} "
           f"resamples, {LEVEL:.0%} intervals of the difference, dearer minus cheaper) along the Pareto front of mean "
           "KL against bytes:")
    return [how, *(p.text() for p in found)]


Z95 = 1.96


def floor_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The floor as a sentence and the variants indistinguishable from the baseline by it; none without a floor."""
    base = next((r for r in rows if r.get("status") == "ok" and r.get("noise_floor")), None)
    if base is None:
        return []
    f = base["noise_floor"]
    top = f["kl_mean"] + Z95 * f["kl_mean_uncertainty"]
    under = [r["variant"] for r in rows if r is not base and r.get("status") == "ok"
             and r.get("kl_divergence_mean") is not None
             and r["kl_divergence_mean"] - Z95 * (r.get("kl_divergence_mean_uncertainty") or 0.0) <= top]
    return [f"Noise floor, {f['path']}: mean KL {f['kl_mean']:.6f} ± {f['kl_mean_uncertainty']:.6f}, p99 "
            f"{f['kl_p99']:.5f}, same top p {f['same_top_p_percent']:.2f}%, RMS Δp {f['delta_p_rms_percent']:.3f}%. "
            + (f"Not distinguishable from the baseline (mean KL within {Z95}σ of the floor's): {', '.join(under)}."
               if under else "Every other variant's mean KL is above it.")]
