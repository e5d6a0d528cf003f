"""Whether a row's timings were taken on a noisy or busy machine: a wide spread of decode steps, a copy
bandwidth that changed while the variant ran, a load average above the threads used, a process that got too
little of its threads' CPU, or another quantlab process timing on the host at the same time. Derived from the
row's own recorded figures."""
from __future__ import annotations

from typing import Any

from .base import Column, Measurement, Result, register

NOISY_P90_OVER_P10 = 2.0  # decode steps: the slowest tenth at least twice the fastest tenth
NOISY_BANDWIDTH_CHANGE = 0.25  # the copy bandwidth after the variant differs from before it by a quarter or more
BUSY_LOAD_ABOVE_THREADS = 1.0  # load average at least one runnable thread more than the process's own threads
BUSY_CPU_SHARE = 0.6  # the process got less than this share of its threads' CPU time while timed


class TimingNoise(Result):
    decode_p90_over_p10: float
    bandwidth_change_share: float | None = None
    noisy: bool
    timing_noise: str  # why the row is noisy; empty when it is not


def busy_reasons(row: dict[str, Any]) -> list[str]:
    """Why a timed point ran on a busy machine, from what was recorded beside it (CPU figures only)."""
    why = []
    threads, load, share = row.get("threads"), row.get("load_average_1m"), row.get("process_cpu_share")
    on_cpu = str(row.get("device", "cpu")).startswith("cpu")
    if on_cpu and threads and load is not None and load >= threads + BUSY_LOAD_ABOVE_THREADS:
        why.append(f"load {load:.1f} on {threads} threads")
    if on_cpu and share is not None and share < BUSY_CPU_SHARE:
        why.append(f"{share:.0%} of its threads' CPU")
    if row.get("concurrent_timed_runs"):
        why.append(f"{row['concurrent_timed_runs']} other quantlab run(s) timing at once")
    return why


@register("timing_noise", f"rows whose decode p90/p10 exceeds {NOISY_P90_OVER_P10} or whose copy bandwidth changed "
          f"by {NOISY_BANDWIDTH_CHANGE:.0%} or more while they ran, or that ran on a busy machine")
class Noise(Measurement):
    order = 70
    result = TimingNoise
    scope = "point"
    derived = True
    title = "timing noise"
    columns = (Column("timing_noise", "timing", ""),)

    def derive(self, row: dict[str, Any]) -> TimingNoise | None:
        p10, p90 = row.get("decode_ms_p10"), row.get("decode_ms_p90")
        if not p10 or p90 is None:
            return None
        spread = p90 / p10
        before, after = row.get("memory_bandwidth_bytes_per_s"), row.get("memory_bandwidth_after_bytes_per_s")
        change = abs(after - before) / before if before and after else None
        why = []
        if spread > NOISY_P90_OVER_P10:
            why.append(f"p90/p10 {spread:.1f}")
        if change is not None and change >= NOISY_BANDWIDTH_CHANGE:
            why.append(f"bandwidth changed {change:.0%}")
        why += busy_reasons(row)
        return TimingNoise(decode_p90_over_p10=round(spread, 3), bandwidth_change_share=None if change is None else round(change, 3),
                           noisy=bool(why), timing_noise=("noisy: " + ", ".join(why)) if why else "")

    def alert(self, row: dict[str, Any]) -> str | None:
        if not row.get("noisy"):
            return None
        return f"timings {row['timing_noise']} (flagged in the reports; rerun on a quiet machine)"

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        noisy = sorted({r["variant"] for r in rows for p in r.get("decode_points") or [r] if p.get("noisy")})
        return (f"a row is flagged noisy when its decode p90/p10 exceeds {NOISY_P90_OVER_P10}, the copy bandwidth "
                f"measured after it differs from the one before it by {NOISY_BANDWIDTH_CHANGE:.0%} or more, the load "
                f"average reached its threads + {BUSY_LOAD_ABOVE_THREADS:g}, the process got under "
                f"{BUSY_CPU_SHARE:.0%} of its threads' CPU while timed (CPU), or another quantlab process was timing "
                "on the host at the same time; " + (f"flagged: {', '.join(noisy)}." if noisy else "none flagged."))
