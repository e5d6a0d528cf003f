"""What each per-layer choice costs in bytes at a workload: a decoder layer's KV cache in a KV format at
``batch × context`` positions (a sliding-window layer keeps at most its window), from the format's own analytic
formula, the one ``quantlab estimate`` and the run's records print for the whole model."""
from __future__ import annotations

from typing import Any

import torch

from ..kv.format import KVFormat, layer_windows, single_layer_config


def layer_kv_bytes(fmt: KVFormat, config: Any, batch_size: int, tokens: int, dtype: torch.dtype) -> list[int | None]:
    """Each decoder layer's KV-cache bytes in ``fmt`` for ``batch_size`` sequences of ``tokens`` positions (None
    where the format leaves its layout to a backend); they sum to the format's figure for the whole model."""
    per_kind: dict[int | None, int | None] = {}
    out = []
    for window in layer_windows(config):
        if window not in per_kind:
            per_kind[window] = fmt.cache_bytes_analytic(single_layer_config(config, window), batch_size, tokens, dtype)
        out.append(per_kind[window])
    return out
