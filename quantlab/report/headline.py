"""The report's answer, derived from the records by rules it states: the smallest variant whose quality stays
within a tolerance of the baseline, the best quality within a byte budget, and the fastest variant within the
tolerance whose timing can be trusted. A rule with no answer says why; ties and variants that cannot be told
apart are named, not hidden.

Quality is judged by mean KL divergence from the baseline where the row has it, else by perplexity relative to
the baseline's. Bytes are the measured weights plus the KV cache at the first decode point."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20

# Defaults users of the field recognise: a mean KL of 0.01 nats is about llama.cpp's Q5_K_M on Llama-3-8B (its
# perplexity tool's table: Q6_K 0.0055, Q5_K_M 0.0108, Q4_K_M 0.0282); +1% perplexity is the "99% of the reference"
# convention of MLPerf's closed division. Half the baseline's bytes is the first budget a compression question asks.
KL_TOLERANCE_NATS = 0.01
PERPLEXITY_TOLERANCE_PERCENT = 1.0
BUDGET_SHARE = 0.5
SAME_BYTES_SHARE = 0.005  # footprints this close are the same size (a tie, said)
SAME_QUALITY_SHARE = 0.05  # mean KLs this close cannot be ranked without an interval


@dataclass(frozen=True)
class Rules:
    """The headline's tolerance and budget (a recipe's ``report:`` section; these defaults otherwise)."""

    kl_tolerance_nats: float = KL_TOLERANCE_NATS
    perplexity_tolerance_percent: float = PERPLEXITY_TOLERANCE_PERCENT
    budget_share: float = BUDGET_SHARE
    budget_bytes: int | None = None

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> "Rules":
        given = ((manifest.get("recipe") or {}).get("report") or {})
        known = {k: v for k, v in given.items() if k in cls.__dataclass_fields__ and v is not None}
        return cls(**known)


@dataclass
class Judged:
    """One measured row as the rules see it."""

    row: dict[str, Any]
    footprint_bytes: float
    metric: str | None  # "kl" or "ppl"; None: no quality figure
    loss: float  # mean KL (nats) or perplexity change in percent; NaN without a figure
    within: bool

    @property
    def variant(self) -> str:
        return str(self.row["variant"])

    @property
    def noisy(self) -> bool:
        return bool(self.row.get("noisy"))


@dataclass
class Answer:
    """One rule's outcome: the variant it picks (None: no answer) and a sentence with the figures or the reason."""

    key: str  # smallest | budget | fastest
    title: str  # the question, with its threshold
    variant: str | None
    text: str  # Markdown: the figures, ties, or why there is no answer
    figures: dict[str, str] = field(default_factory=dict)  # short cells for the command line's summary


@dataclass
class Headline:
    rules: Rules
    baseline: str
    answers: list[Answer]
    rule_text: str  # how quality, bytes and the budget were judged
    all_noisy: bool
    budget_text: str = ""  # the byte budget and how it was set


def _number(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(float(x)) else math.nan


def footprint(row: dict[str, Any]) -> float:
    """Weights + KV cache at the first decode point, in bytes (NaN without weights)."""
    kv = _number(row.get("kv_cache_bytes"))
    return _number(row.get("weight_bytes")) + (0.0 if math.isnan(kv) else kv)


def judge(rows: list[dict[str, Any]], baseline: str, rules: Rules) -> list[Judged]:
    """Every measured row with its footprint and quality verdict."""
    base = next((r for r in rows if r.get("variant") == baseline and r.get("status") == "ok"), None)
    base_ppl = _number(base.get("perplexity")) if base else math.nan
    out = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        kl, ppl = _number(r.get("kl_divergence_mean")), _number(r.get("perplexity"))
        if r.get("variant") == baseline:
            metric, loss, within = ("kl" if not math.isnan(kl) else "ppl" if not math.isnan(ppl) else None), 0.0, True
        elif not math.isnan(kl):
            metric, loss, within = "kl", kl, kl <= rules.kl_tolerance_nats
        elif not math.isnan(ppl) and not math.isnan(base_ppl) and base_ppl > 0:
            loss = (ppl / base_ppl - 1) * 100
            metric, within = "ppl", loss <= rules.perplexity_tolerance_percent
        else:
            metric, loss, within = None, math.nan, False
        out.append(Judged(r, footprint(r), metric, loss, within))
    return out


def _mib(b: float) -> str:
    x = b / MIB
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}" if x >= 10 else f"{x:.3f}"


def quality_text(j: Judged) -> str:
    """``mean KL 0.00123`` or ``perplexity +0.45%`` (with the perplexity)."""
    if j.metric == "kl":
        return f"mean KL {j.loss:.4g} nats"
    if j.metric == "ppl":
        return f"perplexity {round(j.loss, 2) + 0.0:+.2f}% ({_number(j.row.get('perplexity')):.3f})"
    return "no quality figure"


def _bytes_text(j: Judged, base: Judged | None) -> str:
    ratio = f" (×{j.footprint_bytes / base.footprint_bytes:.2f} of {base.variant})" if base and base.footprint_bytes else ""
    return f"{_mib(j.footprint_bytes)} MiB of weights + KV cache{ratio}"


def _ranked_ties(best: Judged, others: list[Judged]) -> list[Judged]:
    """Rows of the same bytes as ``best`` (within ``SAME_BYTES_SHARE``)."""
    return [o for o in others if o is not best and abs(o.footprint_bytes - best.footprint_bytes)
            <= SAME_BYTES_SHARE * best.footprint_bytes]


def _indistinguishable(a: Judged, b: Judged) -> str | None:
    """Why ``b``'s quality cannot be told from ``a``'s (overlapping Δppl intervals, or mean KLs within 5%)."""
    lo_a, hi_a = _number(a.row.get("delta_perplexity_ci95_low")), _number(a.row.get("delta_perplexity_ci95_high"))
    lo_b, hi_b = _number(b.row.get("delta_perplexity_ci95_low")), _number(b.row.get("delta_perplexity_ci95_high"))
    if not any(math.isnan(x) for x in (lo_a, hi_a, lo_b, hi_b)) and lo_a <= hi_b and lo_b <= hi_a:
        return "their Δppl 95% intervals overlap"
    if a.metric == b.metric == "kl" and a.loss > 0 and abs(b.loss - a.loss) <= SAME_QUALITY_SHARE * a.loss:
        return f"mean KLs within {SAME_QUALITY_SHARE:.0%} of each other"
    return None


def smallest_within(judged: list[Judged], base: Judged | None, rules: Rules) -> Answer:
    title = "Smallest within tolerance"
    passing = sorted((j for j in judged if j.within and not math.isnan(j.footprint_bytes)),
                     key=lambda j: (j.footprint_bytes, j.loss))
    if not any(j.metric for j in judged):
        return Answer("smallest", title, None, "no quality figure was measured (add `evaluations: {perplexity: {}, "
                      "divergence: {}}` to the recipe).")
    smaller = [j for j in judged if j is not base and j.metric and base is not None
               and j.footprint_bytes < base.footprint_bytes]
    if not passing or passing[0] is base:
        closest = sorted(smaller, key=lambda j: (j.metric != "kl", j.loss))
        note = f" The closest smaller one is **{closest[0].variant}** ({quality_text(closest[0])})." if closest else ""
        return Answer("smallest", title, None, "no variant smaller than the baseline stays within the tolerance." + note)
    group = [passing[0], *_ranked_ties(passing[0], passing)]  # the same size, to within SAME_BYTES_SHARE
    if base is not None and base in group:
        saved = base.footprint_bytes - passing[0].footprint_bytes
        return Answer("smallest", title, None, "no variant is materially smaller than the baseline: those within the "
                      f"tolerance hold within {SAME_BYTES_SHARE:.1%} of its bytes at this workload (the smallest, "
                      f"**{passing[0].variant}**, saves {_mib(saved)} MiB).")
    best = min(group, key=lambda j: j.loss)
    text = f"**{best.variant}**: {_bytes_text(best, base)}, {quality_text(best)}."
    ties = [t for t in group if t is not best]
    if ties:
        text += f" Tied in bytes (within {SAME_BYTES_SHARE:.1%}) with " + ", ".join(
            f"**{t.variant}** ({quality_text(t)})" for t in ties) + f"; {best.variant} is named for its lower loss."
    return Answer("smallest", title, best.variant, text, {"bytes": f"{_mib(best.footprint_bytes)} MiB",
                                                          "quality": quality_text(best)})


def budget_bytes(base: Judged | None, rules: Rules) -> tuple[float, str]:
    """The byte budget and how it was set."""
    if rules.budget_bytes is not None:
        return float(rules.budget_bytes), f"{_mib(rules.budget_bytes)} MiB (report.budget_bytes)"
    if base is None or math.isnan(base.footprint_bytes):
        return math.nan, f"{rules.budget_share:g} of the baseline's bytes (the baseline was not measured)"
    b = rules.budget_share * base.footprint_bytes
    return b, f"{_mib(b)} MiB ({rules.budget_share:g} × the baseline's weights + KV cache)"


def best_within_budget(judged: list[Judged], base: Judged | None, rules: Rules) -> Answer:
    limit, how = budget_bytes(base, rules)
    title = f"Best quality within {how}"
    fits = [j for j in judged if j.metric and not math.isnan(limit) and j.footprint_bytes <= limit]
    if not fits:
        smallest = min((j for j in judged if not math.isnan(j.footprint_bytes)), key=lambda j: j.footprint_bytes,
                       default=None)
        why = "no variant with a quality figure fits it" + (
            f"; the smallest measured is **{smallest.variant}** at {_mib(smallest.footprint_bytes)} MiB" if smallest else "")
        return Answer("budget", title, None, why + ".")
    by_kl = all(j.metric == "kl" for j in fits)
    ranked = sorted(fits, key=lambda j: (j.loss if by_kl else _number(j.row.get("perplexity")), j.footprint_bytes))
    best = ranked[0]
    measure = "mean KL" if by_kl else "perplexity"
    text = f"**{best.variant}**: {quality_text(best)}, {_bytes_text(best, base)}; ranked by {measure}" + (
        "" if by_kl or len({j.metric for j in fits}) == 1 else " (some rows have no KL through their cache)") + "."
    close = [(o, why) for o in ranked[1:] if (why := _indistinguishable(best, o))]
    if close:
        text += " Not distinguishable from " + ", ".join(f"**{o.variant}** ({quality_text(o)}: {why})"
                                                         for o, why in close) + "."
    return Answer("budget", title, best.variant, text, {"bytes": f"{_mib(best.footprint_bytes)} MiB",
                                                        "quality": quality_text(best)})


def _speed_text(j: Judged, base: Judged | None) -> str:
    ms = _number(j.row.get("decode_ms_per_token"))
    ratio = ""
    if base is not None and not base.noisy and _number(base.row.get("decode_ms_per_token")) > 0:
        ratio = f", ×{_number(base.row.get('decode_ms_per_token')) / ms:.2f} the baseline's speed"
    return f"{ms:.2f} ms per decoded token{ratio} (engine {j.row.get('engine', '—')})"


def fastest_trustworthy(judged: list[Judged], base: Judged | None, rerun: str) -> Answer:
    title = "Fastest trustworthy within tolerance"
    timed = [j for j in judged if not math.isnan(_number(j.row.get("decode_ms_per_token")))]
    if not timed:
        return Answer("fastest", title, None, "no decode timing was measured.")
    quiet = [j for j in timed if not j.noisy]
    if not quiet:
        return Answer("fastest", title, None, f"no trustworthy timing: all {len(timed)} timed rows were flagged noisy "
                      f"(timed on a busy machine). {rerun}")
    candidates = sorted((j for j in quiet if j.within), key=lambda j: _number(j.row.get("decode_ms_per_token")))
    if not candidates:
        return Answer("fastest", title, None, "none of the variants within the tolerance was timed on a quiet machine "
                      f"({len(quiet)} quiet rows are all outside it). {rerun}")
    best = candidates[0]
    text = f"**{best.variant}**: {_speed_text(best, base)}."
    hi = _number(best.row.get("decode_ms_p90"))
    overlap = [o for o in candidates[1:] if _number(o.row.get("decode_ms_p10")) <= hi]
    if overlap:
        text += " Not distinguishable from " + ", ".join(
            f"**{o.variant}** ({_number(o.row.get('decode_ms_per_token')):.2f} ms)" for o in overlap) + \
            " (their p10–p90 step ranges overlap)."
    noisy = [j for j in timed if j.noisy and j.within]
    if noisy:
        text += f" Left out as noisy: {', '.join(j.variant for j in noisy)}."
    return Answer("fastest", title, best.variant, text,
                  {"speed": f"{_number(best.row.get('decode_ms_per_token')):.2f} ms/token"})


def rule_text(judged: list[Judged], rules: Rules) -> str:
    kl = any(j.metric == "kl" for j in judged)
    ppl = any(j.metric == "ppl" for j in judged)
    parts = []
    if kl:
        parts.append(f"mean KL divergence from the baseline at most {rules.kl_tolerance_nats:g} nats")
    if ppl:
        parts.append(("rows without KL: " if kl else "") +
                     f"perplexity at most {rules.perplexity_tolerance_percent:g}% above the baseline's")
    tolerance = "; ".join(parts) or "no quality figure"
    return (f"within tolerance = {tolerance}; bytes = measured weights + KV cache at the first decode point; "
            "trustworthy = timing not flagged noisy. Set them in the recipe: `report: {kl_tolerance_nats, "
            "perplexity_tolerance_percent, budget_share, budget_bytes}`.")


def headline(rows: list[dict[str, Any]], manifest: dict[str, Any], rerun: str = "") -> Headline:
    """The three answers for a run's flat rows."""
    rules = Rules.from_manifest(manifest)
    baseline = str(manifest.get("baseline") or (rows[0]["variant"] if rows else ""))
    judged = judge(rows, baseline, rules)
    base = next((j for j in judged if j.variant == baseline), None)
    timed = [j for j in judged if not math.isnan(_number(j.row.get("decode_ms_per_token")))]
    answers = [smallest_within(judged, base, rules), best_within_budget(judged, base, rules),
               fastest_trustworthy(judged, base, rerun)]
    return Headline(rules, baseline, answers, rule_text(judged, rules), bool(timed) and all(j.noisy for j in timed),
                    budget_bytes(base, rules)[1])
