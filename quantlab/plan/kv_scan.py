"""The KV cache's side of a plan's costs: for each group of decoder layers and each candidate KV format, the mean KL
(nats, over the whole vocabulary) of the model's next-token distributions when only that group's cache takes the
candidate, against the baseline cache, with the windows fed through the cache chunk by chunk (the ``kv-chunked``
protocol), so every chunk attends to what the earlier ones stored. A plan's prediction is the sum of its groups'
rows; ``CacheReference.kl`` measures a whole plan the same way, to check that sum."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..eval.perplexity.kv_chunked import logits_through_cache
from ..fidelity.log_probs import log_probs
from ..kv.format import KV_FORMATS, KVFormat
from ..progress import progress


@dataclass(frozen=True)
class KVScanRow:
    layers: tuple[int, ...]
    kv_format: str  # the candidate's label
    kl_nats: float  # mean over every scored position of the windows
    positions: int


class CacheReference:
    """The baseline cache's log-probabilities on the scan's windows (``[windows, window − 1, vocab]`` float32,
    4 bytes per vocabulary entry per position, kept for every comparison)."""

    def __init__(self, model: nn.Module, windows: torch.Tensor, baseline: KVFormat, chunk_tokens: int,
                 batch_size: int) -> None:
        self.model, self.windows, self.chunk_tokens = model, windows, chunk_tokens
        self.baseline = baseline
        device = next(model.parameters()).device
        self.batches = [b.to(device) for b in windows.split(batch_size)]  # on the model's device once
        self.log_probs = [log_probs(logits_through_cache(model, b, baseline, chunk_tokens)[:, :-1]) for b in self.batches]

    def kl(self, kv: KVFormat, model: nn.Module | None = None) -> float:
        """Mean KL(baseline ‖ ``kv``) over every scored position, through the cache; with ``model`` (the baseline
        model with other weights, a quantized copy) in place of the baseline model."""
        total, count = 0.0, 0
        for batch, p in zip(self.batches, self.log_probs):
            q = log_probs(logits_through_cache(model or self.model, batch, kv, self.chunk_tokens)[:, :-1])
            total += (p.exp() * (p - q)).sum(-1).double().sum().item()
            count += p.shape[0] * p.shape[1]
        return total / count


def with_layers(baseline: KVFormat, layers: tuple[int, ...], candidate: KVFormat) -> KVFormat:
    """The baseline cache with ``layers`` stored in ``candidate``."""
    return KV_FORMATS["per-layer"].build(default=baseline, layers=[{"layers": list(layers), "format": candidate}])


def kv_layer_scan(reference: CacheReference, groups: list[tuple[int, ...]],
                  candidates: list[KVFormat]) -> list[KVScanRow]:
    """One row per group × candidate: the KL with only that group's layers in the candidate format."""
    positions = reference.windows.shape[0] * (reference.windows.shape[1] - 1)
    rows = []
    for layers in progress(groups, "KV scan, layer groups"):
        for candidate in candidates:
            kl = reference.kl(with_layers(reference.baseline, layers, candidate))
            rows.append(KVScanRow(tuple(layers), candidate.label, kl, positions))
    return rows
