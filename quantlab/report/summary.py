"""The summary table both reports open with: the variant, its bytes, its quality, then its speed, in at most seven
columns; the rest of a row's story (a timing taken on a busy machine, a quality figure that did not read the KV
cache, a KV format that kept most positions in full precision, a failure) as numbered notes under it.

A row flagged noisy keeps its decode time struck through, with the reason in its note, and no speed ratio."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .headline import MIB, footprint

FULL_PRECISION_NOTE_SHARE = 0.5  # a KV format keeping at least this share of its positions unquantized is noted


@dataclass
class Cell:
    text: str
    struck: bool = False  # a timing that cannot be trusted: shown struck through, greyed
    title: str = ""  # more detail (HTML hover)


@dataclass
class SummaryRow:
    variant: str
    ok: bool
    cells: list[Cell]
    notes: list[int] = field(default_factory=list)  # footnote numbers
    baseline: bool = False
    front: bool = False
    error: str | None = None


@dataclass
class Summary:
    headings: list[str]
    rows: list[SummaryRow]
    footnotes: list[str]

    @property
    def noisy_rows(self) -> int:
        return sum(1 for r in self.rows if any(c.struck for c in r.cells))


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(float(x)) else math.nan


def _mib(b: float) -> str:
    if math.isnan(b):
        return "—"
    x = b / MIB
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}" if x >= 10 else f"{x:.3f}"


def _signed(x: float, spec: str = ".3f") -> str:
    """``x`` with its sign; a value that rounds to zero is +0 (never -0.000)."""
    if math.isnan(x):
        return "—"
    digits = int(spec[1:-1]) if spec.startswith(".") and spec.endswith("f") else 6
    return format(round(x, digits) + 0.0, "+" + spec)


@dataclass(frozen=True)
class SummaryColumn:
    heading: str
    present: Callable[[list[dict[str, Any]]], bool]
    cell: Callable[[dict[str, Any], dict[str, Any] | None], Cell]  # (row, baseline row) -> cell


def _has(name: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda rows: any(not math.isnan(_num(r.get(name))) for r in rows)


def _bytes(row: dict[str, Any], base: dict[str, Any] | None) -> Cell:
    b = footprint(row)
    ref = footprint(base) if base else math.nan
    ratio = f" (×{b / ref:.2f})" if ref and not math.isnan(ref) and not math.isnan(b) else ""
    return Cell(_mib(b) + ratio, title=f"weights {_mib(_num(row.get('weight_bytes')))} MiB + KV cache "
                f"{_mib(_num(row.get('kv_cache_bytes')))} MiB, measured")


def _perplexity(row: dict[str, Any], base: dict[str, Any] | None) -> Cell:
    p = _num(row.get("perplexity"))
    return Cell("—" if math.isnan(p) else f"{p:.3f}")


def _delta_ppl(row: dict[str, Any], base: dict[str, Any] | None) -> Cell:
    """Δ perplexity with its paired 95% interval where divergence measured one, else the plain difference."""
    d = _num(row.get("delta_perplexity"))
    if not math.isnan(d):
        lo, hi = _num(row.get("delta_perplexity_ci95_low")), _num(row.get("delta_perplexity_ci95_high"))
        interval = "" if math.isnan(lo) else f" ({_signed(lo)}–{_signed(hi)})"
        return Cell(_signed(d) + interval, title="paired over the divergence windows, 95% interval")
    p, ref = _num(row.get("perplexity")), _num((base or {}).get("perplexity"))
    return Cell(_signed(p - ref), title="difference of the two perplexities (no interval: no divergence measured)")


def _kl(row: dict[str, Any], base: dict[str, Any] | None) -> Cell:
    k = _num(row.get("kl_divergence_mean"))
    return Cell("—" if math.isnan(k) else f"{k:.5f}", title=f"p99 {_num(row.get('kl_divergence_p99')):.4f}")


def _top1(row: dict[str, Any], base: dict[str, Any] | None) -> Cell:
    t = _num(row.get("top1_agreement_percent"))
    return Cell("—" if math.isnan(t) else f"{t:.2f}")


def _decode(row: dict[str, Any], base: dict[str, Any] | None) -> Cell:
    ms = _num(row.get("decode_ms_per_token"))
    if math.isnan(ms):
        return Cell("—")
    spread = f"p10–p90 {_num(row.get('decode_ms_p10')):.2f}–{_num(row.get('decode_ms_p90')):.2f} ms, engine " \
        f"{row.get('engine', '—')}"
    if row.get("noisy"):
        return Cell(f"{ms:.2f}", struck=True, title=f"{row.get('timing_noise')}; {spread}")
    ref = _num((base or {}).get("decode_ms_per_token"))
    trusted = base is not None and not base.get("noisy") and ref > 0
    return Cell(f"{ms:.2f}" + (f" (×{ref / ms:.2f})" if trusted else ""), title=spread)


COLUMNS: tuple[SummaryColumn, ...] = (
    SummaryColumn("weights + KV MiB (× base)", _has("weight_bytes"), _bytes),
    SummaryColumn("perplexity", _has("perplexity"), _perplexity),
    SummaryColumn("Δppl (95% interval)", _has("delta_perplexity"), _delta_ppl),
    SummaryColumn("Δppl", lambda rows: _has("perplexity")(rows) and not _has("delta_perplexity")(rows), _delta_ppl),
    SummaryColumn("mean KL", _has("kl_divergence_mean"), _kl),
    SummaryColumn("top-1 %", _has("top1_agreement_percent"), _top1),
    SummaryColumn("ms/token (× speed)", _has("decode_ms_per_token"), _decode),
)


def _row_notes(row: dict[str, Any]) -> list[str]:
    """The notes a measured row needs: why its timing is struck, what quality was left out, what its KV kept."""
    notes = []
    if row.get("noisy"):
        notes.append(f"timed on a busy or noisy machine ({row.get('timing_noise', '').removeprefix('noisy: ')}): "
                     "its decode time is struck through and given no speed ratio")
    left = row.get("kv_cache_not_read_by")
    if left:
        notes.append(f"{' and '.join(left)} ran without the KV cache, so {'its figures are' if len(left) == 1 else 'their figures are'}"
                     " left out (—) for this KV format: they would repeat the native cache's")
    kept, tokens = _num(row.get("kv_cache_full_precision_tokens")), _num(row.get("kv_cache_tokens"))
    if tokens > 0 and kept / tokens >= FULL_PRECISION_NOTE_SHARE:
        notes.append(f"its KV format kept {kept:.0f} of the {tokens:.0f} cached positions in full precision "
                     "(residual_tokens), so its cache bytes and quality mostly show the full-precision window; use a "
                     "smaller residual_tokens or longer prompts")
    return notes


def summary(rows: list[dict[str, Any]], baseline: str, front: dict[str, bool]) -> Summary:
    """The summary table of a run's flat rows (in report order)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    base = next((r for r in ok if r.get("variant") == baseline), None)
    columns = [c for c in COLUMNS if c.present(ok)]
    footnotes: list[str] = []

    def note(text: str) -> int:
        if text not in footnotes:
            footnotes.append(text)
        return footnotes.index(text) + 1

    out = []
    for r in rows:
        if r.get("status") != "ok":
            out.append(SummaryRow(r["variant"], False, [], error=str(r.get("error"))))
            continue
        out.append(SummaryRow(r["variant"], True, [c.cell(r, base) for c in columns],
                              [note(t) for t in _row_notes(r)], r["variant"] == baseline, bool(front.get(r["variant"]))))
    return Summary(["variant", *(c.heading for c in columns)], out, footnotes)


def noisy_banner(rows: list[dict[str, Any]], rerun: str) -> str | None:
    """A sentence for the top of the report when rows were timed on a busy machine, with how to time them again."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("decode_ms_per_token") is not None]
    noisy = [r for r in ok if r.get("noisy")]
    if not noisy:
        return None
    every = "Every timed row" if len(noisy) == len(ok) else f"{len(noisy)} of {len(ok)} timed rows"
    verb = "was" if len(noisy) == 1 or len(noisy) == len(ok) else "were"
    return (f"{every} {verb} timed on a busy or noisy machine: their speed figures "
            "are struck through, their speed ratios and roofline shares left blank, and the latency plots leave them "
            f"out. {rerun}")


def rerun_sentence(manifest: dict[str, Any], out_dir: str) -> str:
    """How to measure only the noisy rows' timing again."""
    recipe = manifest.get("recipe_file") or "RECIPE.yaml"
    return (f"To time only those rows again on a quiet machine: `quantlab run {recipe} --out {out_dir} --retime` "
            "(their quality figures are kept).")
