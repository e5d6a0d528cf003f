"""Memory bandwidth of the device: a copy benchmark (the roofline share is derived in ``measurements.roofline``)."""
from __future__ import annotations

import statistics

import torch

from .device import timed_ms

BANDWIDTH_METHOD = "median of 5 copies of 256 MiB (read + write), device synchronized"


def copy_bandwidth_bytes_per_s(device: torch.device, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes moved per second by ``dst.copy_(src)`` (read + write counted), median of ``repeats`` after a warm-up."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = [timed_ms(lambda: dst.copy_(src), device)[1] for _ in range(repeats)]
    return 2 * nbytes / (statistics.median(times) / 1e3)
