"""Share of the memory-bandwidth roofline: derived from the row's own recorded inputs, never from the run's."""
from __future__ import annotations

from typing import Any

from .base import Column, Measurement, Result, register


class RooflineShare(Result):
    decode_bytes_read_per_step: int
    memory_bandwidth_bytes_per_s: int
    roofline_decode_ms: float
    roofline_share: float


def _gbps(x: Any) -> str:
    return f"{x / 1e9:.1f} GB/s" if isinstance(x, (int, float)) else "not measured"


@register("roofline", "bytes a decode step must read over the measured copy bandwidth, as a share of the step time")
class Roofline(Measurement):
    order = 60
    result = RooflineShare
    scope = "point"
    derived = True
    title = "roofline"
    columns = (Column("roofline_share", "roofline", ".1%", higher_is_better=True, timing="blank"),)

    def derive(self, row: dict[str, Any]) -> RooflineShare | None:
        """From the point's decode time, steps, prompt and KV bytes, the variant's weight bytes read per step and
        the bandwidth measured by the process that measured the row."""
        needed = ("decode_ms_per_token", "decode_steps", "prompt_tokens", "decode_weight_bytes_read",
                  "memory_bandwidth_bytes_per_s")
        if any(row.get(k) is None for k in needed):
            return None
        steps, prompt = row["decode_steps"], row["prompt_tokens"]
        kv_tokens = row.get("kv_cache_tokens") or prompt + steps
        kv_mean = (row.get("kv_cache_bytes") or 0) * (prompt + steps / 2) / max(1, kv_tokens)
        bytes_per_step = row["decode_weight_bytes_read"] + kv_mean
        bandwidth = row["memory_bandwidth_bytes_per_s"]
        roofline_ms = bytes_per_step / bandwidth * 1e3
        return RooflineShare(decode_bytes_read_per_step=int(bytes_per_step), memory_bandwidth_bytes_per_s=int(bandwidth),
                             roofline_decode_ms=round(roofline_ms, 5),
                             roofline_share=round(roofline_ms / row["decode_ms_per_token"], 4))

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        bandwidths = sorted({r.get("memory_bandwidth_bytes_per_s") for r in rows if r.get("status") == "ok"} - {None})
        if len(bandwidths) > 1:
            which = (f"the copy bandwidth measured by the process that measured each row ({_gbps(bandwidths[0])} to "
                     f"{_gbps(bandwidths[-1])}; column memory_bandwidth_bytes_per_s)")
        else:
            which = f"the device's copy bandwidth ({_gbps(row.get('memory_bandwidth_bytes_per_s'))}, {row.get('memory_bandwidth_method') or 'not measured'})"
        return (f"bytes one decode step must read (weights it touches + KV cache at the mean decode length) ÷ {which}, "
                "as a share of the measured step time.")
