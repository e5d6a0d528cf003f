"""Decode latency: prefill and per-token times after warm-up, the device synchronized around each step."""
from __future__ import annotations

from typing import Any

from .base import Column, Measurement, Result, engine_notes, register


class DecodeLatency(Result):
    engine: str
    engine_options: dict[str, Any] = {}  # empty in records older than the compiled engine
    prefill_ms: float
    decode_ms_per_token: float
    decode_ms_p10: float
    decode_ms_p90: float
    decode_steps: int
    decode_ms_samples: list[float] | None = None  # every timed step (older records kept the first point's only)
    tokens_per_s: float
    threads: int | None = None  # torch's CPU threads (older records: not recorded)
    load_average_1m: float | None = None  # the host's load average as the timed decode ended
    process_cpu_share: float | None = None  # CPU time the process got / (wall time x threads) while timed
    concurrent_timed_runs: int | None = None  # other quantlab processes timing on this host at the same time
    timing_rounds: int | None = None  # generations pooled, interleaved with other variants' (None: one, alone)
    timing_interleaved_variants: int | None = None  # the variants whose rounds alternated (this one included)


@register("latency", "prefill and per-token decode time after warm-up, device synchronized")
class Latency(Measurement):
    order = 50
    result = DecodeLatency
    scope = "point"
    timing_only = True
    title = "latency"
    columns = (
        Column("prefill_ms", "prefill ms", ".2f", higher_is_better=False, timing="strike"),
        Column("decode_ms_per_token", "decode ms/token (p10–p90)", ".2f", higher_is_better=False,
               spread=("decode_ms_p10", "decode_ms_p90"), timing="strike"),
        Column("tokens_per_s", "tokens/s", ".1f", compare="ratio", higher_is_better=True, timing="strike"),
    )

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        record = ctx.generation(*point).record(batch_size=point[0])
        return DecodeLatency(**{k: record[k] for k in DecodeLatency.model_fields if k in record})

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        w = manifest.get("recipe", {}).get("workload", {})
        return (f"engine `{row.get('engine', 'eager')}` (greedy loop over model.forward with the KV format's cache; "
                f"options {row.get('engine_options') or '—'}), batch {row.get('batch_size')}, prompt "
                f"{row.get('prompt_tokens')} tokens in the main table, {w.get('new_tokens')} decode steps after "
                f"{w.get('warmup_runs')} warm-up generation(s); prefill is the median of {w.get('prefill_repeats')} runs; "
                "decode ms/token is the median step (p10–p90 beside it); the device is synchronized around every timed "
                "step. tokens/s = batch × 1000 / median step." + _interleaved(rows) + engine_notes(rows, "latency"))


def _interleaved(rows: list[dict[str, Any]]) -> str:
    """A sentence on the rows whose steps were pooled from rounds interleaved with other variants'."""
    points = [p for r in rows for p in (r.get("decode_points") or [r]) if p.get("timing_rounds")]
    if not points:
        return ""
    rounds = sorted({p["timing_rounds"] for p in points})
    variants = sorted({p.get("timing_interleaved_variants") or 1 for p in points})
    labels = sorted({str(r.get("variant")) for r in rows
                     if any(p.get("timing_rounds") for p in (r.get("decode_points") or [r]))})
    span = lambda xs: str(xs[0]) if len(xs) == 1 else f"{xs[0]}–{xs[-1]}"  # noqa: E731
    return (f" Timed again interleaved ({', '.join(labels)}): {span(rounds)} rounds, each a warm-up and a timed "
            f"generation of every one of {span(variants)} variants held in one process, in rotating order; the "
            "median step and p10–p90 are over every round's steps, the prefill the median round's, and the load and "
            "CPU share the worst round's.")
