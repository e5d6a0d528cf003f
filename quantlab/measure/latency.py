"""Decode latency: prefill and per-token decode times after warm-up, device synchronized.

Engine ``eager``: a greedy loop over ``model.forward`` with the KV format's cache,
as transformers' ``generate`` runs it, without its logits processors.
"""
from __future__ import annotations

import inspect
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..kv import KVFormat
from .device import timed_ms
from .memory import PeakMemory


@dataclass
class DecodeResult:
    prefill_ms: float
    decode_ms: list[float] = field(repr=False)
    peak_memory_bytes: int = 0
    peak_memory_method: str = ""

    def record(self, batch_size: int) -> dict[str, Any]:
        q = statistics.quantiles(self.decode_ms, n=10, method="inclusive")
        median = statistics.median(self.decode_ms)
        return {
            "engine": "eager",
            "prefill_ms": round(self.prefill_ms, 4),
            "decode_ms_per_token": round(median, 4),
            "decode_ms_p10": round(q[0], 4),
            "decode_ms_p90": round(q[-1], 4),
            "decode_steps": len(self.decode_ms),
            "tokens_per_s": round(batch_size * 1e3 / median, 3),
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_method": self.peak_memory_method,
        }


def prompt_ids(vocab_size: int, batch_size: int, prompt_tokens: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, prompt_tokens), generator=g).to(device)


def cache_kwarg(model: nn.Module) -> str:
    """The forward argument that takes a Cache: ``cache`` in recent transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.inference_mode()
def _generate(model: nn.Module, kv: KVFormat, ids: torch.Tensor, new_tokens: int, device: torch.device) -> tuple[float, list[float]]:
    cache = kv.make_cache(model.config)
    arg = cache_kwarg(model)
    out, prefill_ms = timed_ms(lambda: model(input_ids=ids, use_cache=True, **{arg: cache}), device)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    steps = []
    for _ in range(new_tokens):
        def step(token: torch.Tensor = token) -> torch.Tensor:
            logits = model(input_ids=token, use_cache=True, **{arg: cache}).logits
            return logits[:, -1].argmax(-1, keepdim=True)

        token, ms = timed_ms(step, device)
        steps.append(ms)
    return prefill_ms, steps


def measure_decode(
    model: nn.Module, kv: KVFormat, *, batch_size: int, prompt_tokens: int, new_tokens: int,
    warmup_runs: int, prefill_repeats: int, seed: int, device: torch.device,
) -> DecodeResult:
    """Warm up, time ``prefill_repeats`` prefills, then one generation of ``new_tokens`` steps."""
    ids = prompt_ids(model.config.vocab_size, batch_size, prompt_tokens, seed, device)
    for _ in range(warmup_runs):
        _generate(model, kv, ids, min(new_tokens, 8), device)
    prefills = [_generate(model, kv, ids, 0, device)[0] for _ in range(prefill_repeats - 1)]
    peak = PeakMemory(device)
    with peak.track():
        prefill_ms, steps = _generate(model, kv, ids, new_tokens, device)
    prefills.append(prefill_ms)
    return DecodeResult(statistics.median(prefills), steps, peak.peak_bytes, peak.method)
