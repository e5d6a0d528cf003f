"""Peak memory of one generation: the allocator's peak on CUDA, the process's resident peak on CPU."""
from __future__ import annotations

from .base import MIB, Column, Measurement, Result, register


class PeakMemoryBytes(Result):
    peak_memory_bytes: int
    peak_prefill_bytes: int
    peak_decode_bytes: int
    peak_reserved_bytes: int | None = None
    peak_memory_method: str
    rss_before_load_bytes: int | None = None
    peak_memory_bytes_by_device: dict[str, int] | None = None  # CUDA, a model spread over several devices


@register("peak_memory", "the larger of the prefill and decode peaks of the timed generation")
class PeakMemory(Measurement):
    order = 40
    result = PeakMemoryBytes
    scope = "point"
    title = "peak"
    columns = (Column("peak_memory_bytes", "peak MiB", ".1f", MIB, compare="ratio", higher_is_better=False),)

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        m = ctx.generation(*point).memory
        return PeakMemoryBytes(
            peak_memory_bytes=m["peak_memory_bytes"], peak_prefill_bytes=m["peak_prefill_bytes"],
            peak_decode_bytes=m["peak_decode_bytes"], peak_reserved_bytes=m.get("peak_reserved_bytes"),
            peak_memory_method=m["peak_memory_method"],
            rss_before_load_bytes=(ctx.rss_before_load_bytes or None) if ctx.served() is None else None,
            peak_memory_bytes_by_device=m.get("peak_memory_bytes_by_device"))

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        return f"the larger of the prefill and decode peaks of that generation; method: {row.get('peak_memory_method', '—')}."
