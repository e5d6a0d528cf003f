"""KV-cache bytes after the timed generation: measured from the cache's tensors, beside the formulas."""
from __future__ import annotations

from .base import MIB, Column, Measurement, Result, register


class KVCacheBytes(Result):
    kv_cache_bytes: int
    kv_cache_bytes_analytic: int | None = None
    kv_cache_bytes_estimate: int | None = None
    kv_cache_tokens: int
    kv_cache_full_precision_tokens: int | None = None  # of those, kept unquantized (a format's recent residual window)
    kv_cache_calibration: str | None = None  # what the format calibrated (static scales) and on what text


@register("kv_cache", "bytes the KV cache holds after the timed generation, beside its formula and the config's")
class KVCache(Measurement):
    order = 30
    result = KVCacheBytes
    scope = "point"
    title = "KV cache"
    columns = (
        Column("kv_cache_bytes", "KV cache MiB", ".3f", MIB, compare="ratio", higher_is_better=False),
        Column("kv_cache_bytes_analytic", "KV analytic MiB", ".3f", MIB, summary=False),
        Column("kv_cache_bytes_estimate", "KV config estimate MiB", ".3f", MIB, summary=False),
    )

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        batch, prompt = point
        gen = ctx.generation(batch, prompt)
        tokens = gen.memory["kv_cache_tokens"]
        estimate = ctx.estimate
        predicted = (estimate.beside_measured(ctx.variant.weight, ctx.variant.kv, [(batch, tokens)])["kv_cache_bytes_estimate"][0]
                     if estimate else None)
        return KVCacheBytes(kv_cache_bytes=gen.memory["kv_cache_bytes"],
                            kv_cache_bytes_analytic=gen.memory["kv_cache_bytes_analytic"],
                            kv_cache_bytes_estimate=predicted, kv_cache_tokens=tokens,
                            kv_cache_full_precision_tokens=ctx.variant.kv.full_precision_tokens(tokens),
                            kv_cache_calibration=ctx.variant.kv.calibration())

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        def n(x: object) -> str:
            return f"{x:,}" if isinstance(x, (int, float)) else "—"

        calibrated: dict[str, list[str]] = {}
        for r in rows:
            if r.get("kv_cache_calibration"):
                calibrated.setdefault(r["kv_cache_calibration"], []).append(str(r.get("variant")))
        return (f"measured from the cache's tensors after the timed generation ({row.get('kv_cache_tokens', '—')} "
                f"positions); the format's formula gives {n(row.get('kv_cache_bytes_analytic'))} bytes for the first "
                f"row, the config estimate {n(row.get('kv_cache_bytes_estimate'))}, measured {n(row.get('kv_cache_bytes'))}."
                + "".join(f" {', '.join(names)}: {text}." for text, names in calibrated.items()))
