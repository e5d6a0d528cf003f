"""The plan applied whole and measured: its weights on a copy of the model and its cache, KL against the baseline
through the cache on the KV scan's windows (the whole vocabulary), beside the sum the knapsack predicted; the same
for every uniform configuration that fits the budget, so the plan's advantage is measured, not only predicted."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from ..kv.format import KVFormat
from ..quant.format import WeightFormat
from .kv_scan import CacheReference


@dataclass(frozen=True)
class Measured:
    name: str  # "plan" or "uniform WEIGHTS + KV"
    total_bytes: int
    predicted_kl_nats: float
    kl_nats: float  # measured: the whole configuration at once


def measure_whole(model: nn.Module, reference: CacheReference, configs: dict[str, tuple[WeightFormat, KVFormat]],
                  calibration: Any, log: Callable[[str], None] = lambda _: None) -> dict[str, float]:
    """Each configuration's mean KL through the cache against the reference: its weights quantized on a copy of
    ``model`` (the baseline's own weights when the format is the baseline's), its cache format on the windows."""
    from ..quant.apply import quantize_

    out: dict[str, float] = {}
    quantized: dict[str, nn.Module] = {}  # a weight format shared by several configurations is quantized once
    for name, (weights, kv) in configs.items():
        log(f"measuring {name} whole")
        key = weights.label
        if key not in quantized:
            quantized = {key: copy.deepcopy(model)}  # one copy held at a time
            quantize_(quantized[key], weights, calibration=calibration)
        out[name] = reference.kl(kv, quantized[key])
    return out
