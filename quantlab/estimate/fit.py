"""The fit planner: how many devices of a given size a model needs in each weight x KV format, and the largest
batch and context that fit on a given count. From the same byte formulas ``quantlab run`` reports beside its
measurements."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..errors import QuantlabError
from ..kv.format import KVFormat
from .worksheet import Estimate, kv_payload

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
         "tib": 2**40}
DEFAULT_RESERVE = 0.10


def parse_bytes(text: str, what: str = "--gpu-memory") -> int:
    """``80GiB``, ``80GB``, ``81920MiB`` or a plain byte count."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise QuantlabError(f"{what}: expected a size such as 80GiB, 80GB or 85899345920 (got {text!r})")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


@dataclass
class Fit:
    weight_format: str
    kv_format: str
    weight_bytes: int
    kv_cache_bytes: int  # at the estimate's batch and sequence length, sliding windows retained
    total_bytes: int
    usable_bytes_per_device: int
    devices_needed: int
    fits_on_devices: bool  # on the --gpus count
    max_batch_size: int  # at the estimate's sequence length, on the --gpus count (0: not even one sequence)
    max_seq_len_tokens: int  # at the estimate's batch, on the --gpus count (capped at the position limit)


def _kv(est: Estimate, fmt: KVFormat, batch: int, tokens: int, base: torch.dtype) -> int | None:
    return kv_payload(est.architecture, fmt, batch, tokens, base).bytes_retained


def plan(est: Estimate, kv_formats: list[KVFormat], device_bytes: int, devices: int, base: torch.dtype,
         reserve_share: float = DEFAULT_RESERVE) -> list[Fit]:
    """One ``Fit`` per weight format x KV format of ``est``: weights + KV cache over each device's usable bytes
    (``device_bytes`` less ``reserve_share`` for the CUDA context, allocator fragmentation and the activations
    of a decode step), assuming weights and cache split across devices with no duplication."""
    usable = int(device_bytes * (1 - reserve_share))
    if usable <= 0:
        raise QuantlabError("--gpu-memory leaves nothing usable after the reserve")
    limit = est.architecture.max_position_embeddings or est.seq_len_tokens
    out = []
    for w in est.weights:
        for fmt, k in zip(kv_formats, est.kv):
            if k.bytes_retained is None:
                continue
            total = w.bytes + k.bytes_retained
            capacity = devices * usable - w.bytes
            per_sequence = _kv(est, fmt, 1, est.seq_len_tokens, base) or 0
            max_batch = max(0, capacity // per_sequence) if per_sequence else 0
            out.append(Fit(w.label, k.label, w.bytes, k.bytes_retained, total, usable, max(1, math.ceil(total / usable)),
                           total <= devices * usable, int(max_batch), _longest(est, fmt, capacity, limit, base)))
    return out


def _longest(est: Estimate, fmt: KVFormat, capacity: int, limit: int, base: torch.dtype) -> int:
    """The most positions per sequence (at the estimate's batch) whose cache fits in ``capacity`` bytes."""
    if capacity <= 0:
        return 0
    fits = lambda n: (_kv(est, fmt, est.batch_size, n, base) or 0) <= capacity  # noqa: E731
    if fits(limit):
        return limit
    lo, hi = 0, limit  # the cache grows with positions: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def fit_dicts(fits: list[Fit]) -> list[dict[str, Any]]:
    return [asdict(f) for f in fits]


def render_fit(fits: list[Fit], device_bytes: int, devices: int, est: Estimate, reserve_share: float) -> list[str]:
    """The planner's Markdown section."""
    gib = 2**30
    lines = ["", f"## Fit on {devices} × {device_bytes / gib:.0f} GiB (batch {est.batch_size}, {est.seq_len_tokens:,} positions)",
             "", f"Usable per device: {fits[0].usable_bytes_per_device / gib:.1f} GiB ({reserve_share:.0%} reserved for the "
             "CUDA context, allocator fragmentation and decode activations; prefill activations of long prompts are "
             "not included). Weights and KV cache are assumed split across devices without duplication.", "",
             "| weights | KV cache | weights GiB | KV GiB | total GiB | devices needed | fits | max batch | max positions |",
             "|---|---|---|---|---|---|---|---|---|"] if fits else []
    for f in fits:
        lines.append(f"| {f.weight_format} | {f.kv_format} | {f.weight_bytes / gib:.2f} | {f.kv_cache_bytes / gib:.2f} | "
                     f"{f.total_bytes / gib:.2f} | {f.devices_needed} | {'yes' if f.fits_on_devices else 'no'} | "
                     f"{f.max_batch_size:,} | {f.max_seq_len_tokens:,} |")
    return lines
