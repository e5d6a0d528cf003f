"""Decode latency: prefill and per-token decode times after warm-up, device synchronized.

Engine ``eager``: a greedy loop over ``model.forward`` with the KV format's (dynamic) cache, as
transformers' ``generate`` runs it, without its logits processors. Engine ``compiled``: the same loop
with a static cache and a ``torch.compile``d decode step, as transformers' auto-compiled generation
does; compilation happens in the warm-up.
"""
from __future__ import annotations

import contextlib
import inspect
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..kv import KVFormat
from .device import timed_ms
from .memory import PeakMemory, cuda_devices_of


@dataclass
class DecodeResult:
    prefill_ms: float
    decode_ms: list[float] = field(repr=False)
    memory: dict[str, Any] = field(default_factory=dict)

    engine: str = "eager"
    engine_options: dict[str, Any] = field(default_factory=dict)

    def record(self, batch_size: int) -> dict[str, Any]:
        q = statistics.quantiles(self.decode_ms, n=10, method="inclusive")
        median = statistics.median(self.decode_ms)
        return {
            "engine": self.engine,
            "engine_options": self.engine_options,
            "prefill_ms": round(self.prefill_ms, 4),
            "decode_ms_per_token": round(median, 4),
            "decode_ms_p10": round(q[0], 4),
            "decode_ms_p90": round(q[-1], 4),
            "decode_steps": len(self.decode_ms),
            "decode_ms_samples": [round(t, 4) for t in self.decode_ms],
            "tokens_per_s": round(batch_size * 1e3 / median, 3),
            **self.memory,
        }


def prompt_ids(vocab_size: int, batch_size: int, prompt_tokens: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, prompt_tokens), generator=g).to(device)


def cache_kwarg(model: nn.Module) -> str:
    """The forward argument that takes a Cache: ``cache`` in recent transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


ENGINES = ("eager", "compiled")


def compile_options(device: torch.device) -> dict[str, Any]:
    """What the compiled engine sets: torch.compile of the decode step over a static cache; on CUDA also
    CUDA graphs (mode reduce-overhead) and gpt-fast's inductor flags, which decide int8 speed there."""
    if device.type == "cuda":
        return {"mode": "reduce-overhead", "dynamic": False, "inductor": {
            "coordinate_descent_tuning": True, "triton.unique_kernel_names": True, "fx_graph_cache": True}}
    return {"mode": "default", "dynamic": False, "inductor": {"fx_graph_cache": True}}


def compiled_step(model: nn.Module, device: torch.device) -> Callable[..., Any]:
    """The model's forward under torch.compile with the engine's mode (compile within ``inductor_options``)."""
    options = compile_options(device)
    return torch.compile(model.forward, mode=options["mode"], dynamic=options["dynamic"])


def inductor_options(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The engine's inductor settings for the duration of a ``with`` block, restored after it (the caller's
    global inductor config is left as it was)."""
    import torch._inductor.config as inductor

    return inductor.patch(compile_options(device)["inductor"])


class Generation:
    """One greedy generation through the KV format's cache, each forward timed with the device synchronized.

    ``step`` (a compiled forward) with ``max_cache_len`` runs decode steps over a static cache; the prefill
    always runs the model eagerly."""

    def __init__(self, model: nn.Module, kv: KVFormat, device: torch.device,
                 step: Callable[..., Any] | None = None, max_cache_len: int | None = None) -> None:
        self.model, self.device, self.step = model, device, step or model
        self.cache = kv.make_cache(model.config, max_cache_len)
        self.arg = cache_kwarg(model)
        self.position = 0
        self.token: torch.Tensor | None = None

    @torch.inference_mode()
    def _next(self, forward: Callable[..., Any], ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(self.position, self.position + ids.shape[1], device=ids.device)
        logits = forward(input_ids=ids, use_cache=True, cache_position=positions, **{self.arg: self.cache}).logits
        self.position += ids.shape[1]
        return logits[:, -1].argmax(-1, keepdim=True)

    def prefill(self, ids: torch.Tensor) -> float:
        self.token, ms = timed_ms(lambda: self._next(self.model, ids), self.device)
        return ms

    def decode(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            self.token, ms = timed_ms(lambda: self._next(self.step, self.token), self.device)
            times.append(ms)
        return times


def measure_decode(
    model: nn.Module, kv: KVFormat, *, batch_size: int, prompt_tokens: int, new_tokens: int,
    warmup_runs: int, prefill_repeats: int, seed: int, device: torch.device, engine: str = "eager",
) -> DecodeResult:
    """Warm up, time ``prefill_repeats`` prefills, then one generation of ``new_tokens`` steps.

    Peak memory is tracked for the prefill and for the decode steps of the last generation; the KV
    cache it leaves is measured from its tensors and beside the format's formula.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    compiled = engine == "compiled"
    with inductor_options(device) if compiled else contextlib.nullcontext():
        return _measure_decode(model, kv, batch_size=batch_size, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                               warmup_runs=warmup_runs, prefill_repeats=prefill_repeats, seed=seed, device=device,
                               compiled=compiled)


def _measure_decode(
    model: nn.Module, kv: KVFormat, *, batch_size: int, prompt_tokens: int, new_tokens: int,
    warmup_runs: int, prefill_repeats: int, seed: int, device: torch.device, compiled: bool,
) -> DecodeResult:
    engine = "compiled" if compiled else "eager"
    ids = prompt_ids(model.config.vocab_size, batch_size, prompt_tokens, seed, device)
    step = compiled_step(model, device) if compiled else None
    max_len = prompt_tokens + new_tokens if compiled else None

    def generation() -> Generation:
        return Generation(model, kv, device, step, max_len)

    for _ in range(max(warmup_runs, 1 if compiled else 0)):  # compiled: compilation happens here
        warm = generation()
        warm.prefill(ids)
        warm.decode(min(new_tokens, 8))
    prefills = [generation().prefill(ids) for _ in range(prefill_repeats - 1)]
    gen = generation()
    spans = cuda_devices_of(model) if device.type == "cuda" else None
    prefill_peak, decode_peak = PeakMemory(device, cuda_devices=spans), PeakMemory(device, cuda_devices=spans)
    with prefill_peak.track():
        prefills.append(gen.prefill(ids))
    with decode_peak.track():
        steps = gen.decode(new_tokens)
    dtype = model.get_input_embeddings().weight.dtype
    memory = {
        "peak_memory_bytes": max(prefill_peak.peak_bytes, decode_peak.peak_bytes),
        "peak_prefill_bytes": prefill_peak.peak_bytes,
        "peak_decode_bytes": decode_peak.peak_bytes,
        "peak_memory_method": decode_peak.method,
        **({"peak_reserved_bytes": max(prefill_peak.reserved_bytes or 0, decode_peak.reserved_bytes or 0)}
           if decode_peak.reserved_bytes is not None else {}),
        **({"peak_memory_bytes_by_device": {k: max(v, (prefill_peak.by_device or {}).get(k, 0))
                                            for k, v in decode_peak.by_device.items()}}
           if decode_peak.by_device else {}),
        "kv_cache_bytes": kv.cache_bytes(gen.cache),
        "kv_cache_bytes_analytic": kv.cache_bytes_analytic(model.config, batch_size, prompt_tokens + new_tokens, dtype),
        "kv_cache_tokens": prompt_tokens + new_tokens,
    }
    options = compile_options(device) if compiled else {"cache": type(gen.cache).__name__, "compiled": False}
    return DecodeResult(statistics.median(prefills), steps, memory, engine, options)
