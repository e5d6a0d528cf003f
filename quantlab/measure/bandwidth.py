"""Memory bandwidth of the device (a copy benchmark) and each decode step's share of that roofline."""
from __future__ import annotations

import statistics
from typing import Any

import torch

from .device import timed_ms


def copy_bandwidth_bytes_per_s(device: torch.device, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes moved per second by ``dst.copy_(src)`` (read + write counted), median of ``repeats`` after a warm-up."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = [timed_ms(lambda: dst.copy_(src), device)[1] for _ in range(repeats)]
    return 2 * nbytes / (statistics.median(times) / 1e3)


def roofline(row: dict[str, Any], bandwidth_bytes_per_s: float) -> dict[str, Any]:
    """Bytes a decode step must read (weights it touches + the KV cache at the mean decode length) over
    the measured bandwidth, as a time and as a share of the measured step time."""
    if "decode_ms_per_token" not in row or "decode_weight_bytes_read" not in row:
        return {}
    steps, prompt = row["decode_steps"], row["prompt_tokens"]
    kv_mean = row.get("kv_cache_bytes", 0) * (prompt + steps / 2) / max(1, row.get("kv_cache_tokens", prompt + steps))
    bytes_per_step = row["decode_weight_bytes_read"] + kv_mean
    roofline_ms = bytes_per_step / bandwidth_bytes_per_s * 1e3
    return {
        "decode_bytes_read_per_step": int(bytes_per_step),
        "memory_bandwidth_bytes_per_s": int(bandwidth_bytes_per_s),
        "roofline_decode_ms": round(roofline_ms, 5),
        "roofline_share": round(roofline_ms / row["decode_ms_per_token"], 4),
    }
