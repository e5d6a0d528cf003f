"""Decode latency: prefill and per-token decode times after warm-up, device synchronized.

Engine ``eager``: a greedy loop over ``model.forward`` with the KV format's (dynamic) cache, as
transformers' ``generate`` runs it, without its logits processors, with quantlab's grouped attention
(``attention.py``) where the architecture takes it; a format whose stored codes that attention reads
(``kv/code_attention.py``) runs its static layers, sized for the generation, so a decode row reads the codes
as the compiled step does instead of rebuilding the dequantized history. Engine ``compiled``: the same loop
with a static cache and a ``torch.compile``d decode step (``compiled.py``), as transformers' auto-compiled
generation does; compilation happens in the warm-up and is timed apart from it (``compile_s``).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from inspect import signature
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ...errors import UnsupportedError
from ...kv import KVFormat
from ...kv.code_attention import available as code_attention_available
from ...kv.hf_compat import cache_kwarg
from ...progress import stage
from ..base import DecodeResult, prompt_ids
from ..device import timed_ms
from ..machine_load import watch_machine
from ..memory import PeakMemory, cuda_devices_of
from .attention import CACHE_KWARG, mark_code_attention
from .compiled import (
    ATTENTION,
    FUSED_ATTENTION,
    attention_implementation,
    compile_options,
    compiled_step,
    fused_row_linears,
    inductor_options,
)

MODES = ("eager", "compiled")  # the engines this module runs
AUTO = "auto"  # compiled where the step captures, eager otherwise (measure_decode records why)


class Generation:
    """One greedy generation through the KV format's cache, each forward timed with the device synchronized.

    ``step`` (a compiled forward) with ``max_cache_len`` runs decode steps over a static cache; the prefill
    always runs the model eagerly."""

    def __init__(self, model: nn.Module, kv: KVFormat, device: torch.device,
                 step: Callable[..., Any] | None = None, max_cache_len: int | None = None) -> None:
        self.model, self.device, self.step = model, device, step or model
        self.max_cache_len = max_cache_len
        self.cache = kv.make_cache(model.config, max_cache_len)
        self.arg = cache_kwarg(model)
        # the cache again, for the attention of layers that read their stored codes (engine/attention.py)
        self.extra = {CACHE_KWARG: self.cache} if any(hasattr(layer, "reads_codes") for layer in
                                                      getattr(self.cache, "layers", ())) else {}
        self.position = 0
        self.token: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None  # the last position's logits of the latest forward
        # the prefill's output head for the last position only, as generate() and llama.cpp run it: the other
        # positions' logits are not used (Gemma 3's 262,144-row head over 128 positions is 43 GFLOP)
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in signature(model.forward).parameters else {}

    @torch.inference_mode()
    def _next(self, forward: Callable[..., Any], ids: torch.Tensor, **options: Any) -> torch.Tensor:
        positions = torch.arange(self.position, self.position + ids.shape[1], device=ids.device)
        logits = forward(input_ids=ids, use_cache=True, cache_position=positions, **{self.arg: self.cache},
                         **self.extra, **options).logits
        self.position += ids.shape[1]
        self.logits = logits[:, -1]
        # the first maximum, as argmax gives it: torch's CPU argmax over one bf16 row of 49,152 takes about 190 us
        # on 2 cores, max with indices about 45
        return torch.max(self.logits, -1, keepdim=True).indices

    def prefill(self, ids: torch.Tensor) -> float:
        if self.extra:  # the attention in effect stays for the generation: the layers are told once
            mark_code_attention(self.model, self.cache)
        self.token, ms = timed_ms(lambda: self._next(self.model, ids, **self.last_only), self.device)
        return ms

    def decode(self, steps: int) -> list[float]:
        if self.max_cache_len is not None and self.position + steps > self.max_cache_len:
            raise ValueError(f"{self.position} positions + {steps} steps exceed the static cache's "
                             f"{self.max_cache_len}")  # a compiled step would index past its buffers
        times = []
        for _ in range(steps):
            self.token, ms = timed_ms(lambda: self._next(self.step, self.token), self.device)
            times.append(ms)
        return times


class DecodeEngine:
    """A model made ready for timed generations by one engine, for the duration of a ``with`` block.

    ``compiled`` enters the engine's inductor settings and attention, and compiles the step once; every
    ``generation()`` then reuses it (a benchmark interleaving models round by round compiles each once).
    ``warm_up`` runs one generation and, the first time, records the compilation (``options["compile_s"]``:
    the first compiled step, timed apart from the measured ones). ``options`` replace some of
    ``compile_options`` (``attention``, ``module_guards``, ``half_linears``, ``inductor``: for comparing the
    engine with its alternatives)."""

    def __init__(self, model: nn.Module, kv: KVFormat, device: torch.device, engine: str = "eager",
                 max_cache_len: int | None = None, options: dict[str, Any] | None = None) -> None:
        if engine not in MODES:  # "auto" is measure_decode's choice between them
            raise ValueError(f"engine must be one of {MODES}, got {engine!r}")
        if engine == "compiled" and max_cache_len is None:
            raise ValueError("the compiled engine decodes over a static cache: give max_cache_len")
        self.model, self.kv, self.device, self.name = model, kv, device, engine
        self.compiled = engine == "compiled"
        # eager: static layers where the format has them and the attention reads their codes (a known length)
        codes = (kv.dequantizes_on_read and max_cache_len is not None and code_attention_available()
                 and kv_static_problem(kv, model) is None)
        self.max_cache_len = max_cache_len if self.compiled or codes else None
        self.options: dict[str, Any] = ({**compile_options(device), **(options or {})} if self.compiled
                                        else {"attention": ATTENTION, **(options or {})})
        if self.options.get("attention") == ATTENTION and kv.dequantizes_on_read and self.max_cache_len is not None:
            self.options["attention"] = FUSED_ATTENTION
        self.step: Callable[..., Any] | None = None
        self._context = contextlib.ExitStack()

    def __enter__(self) -> "DecodeEngine":
        self._context.enter_context(head_input_strides(self.model))
        if "attention" in self.options:
            self.options["attention"] = self._context.enter_context(
                attention_implementation(self.model, self.options["attention"]))
        if self.compiled:
            self._context.enter_context(inductor_options(self.device, self.options["inductor"]))
            kernel = self.options.get("half_linears")
            if (kernel in ("half_rows", "fused_row_matmul")
                    and not self._context.enter_context(fused_row_linears(self.model, kernel))):
                self.options["half_linears"] = "none in the model"
            # every generation passes a cache of its own built alike (same format and length): not guarded
            self.step = compiled_step(self.model, self.device, self.options, (cache_kwarg(self.model), CACHE_KWARG))
        return self

    def __exit__(self, *exc: object) -> None:
        self.step = None
        self._context.close()

    def generation(self) -> Generation:
        return Generation(self.model, self.kv, self.device, self.step, self.max_cache_len)

    def warm_up(self, ids: torch.Tensor, steps: int) -> None:
        first = self.compiled and "compile_s" not in self.options
        with stage("compiling the decode step" if first else "warming up"):
            gen = self.generation()
            gen.prefill(ids)
            started = time.perf_counter()
            gen.decode(1)
            if first:
                self.options["compile_s"] = round(time.perf_counter() - started, 3)
            gen.decode(steps - 1)


@contextlib.contextmanager
def head_input_strides(model: nn.Module) -> Iterator[None]:
    """For the ``with`` block, the output head's input gets its canonical strides. transformers hands the head
    the prompt's last position as a view (``logits_to_keep``), ``[1, 1, hidden]`` with the prompt's strides; torch's
    matmul does not fold such a bfloat16 view into one matrix product but multiplies it as a batch, copying the
    weight expanded to one first: Gemma 3 270M's 262,144 x 640 bf16 head took 570 ms a prefill that way against
    12-18 ms (SmolLM2-135M's about 55 ms). The reshape is a view: no values move."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Module):
        yield
        return

    def canonical(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0] if args else None
        return (x.reshape(x.shape), *args[1:]) if isinstance(x, torch.Tensor) else None

    handle = head.register_forward_pre_hook(canonical)
    try:
        yield
    finally:
        handle.remove()


def measure_decode(
    model: nn.Module, kv: KVFormat, *, batch_size: int, prompt_tokens: int, new_tokens: int,
    warmup_runs: int, prefill_repeats: int, seed: int, device: torch.device, engine: str = "eager",
) -> DecodeResult:
    """Warm up, time ``prefill_repeats`` prefills, then one generation of ``new_tokens`` steps.

    Peak memory is tracked for the prefill and for the decode steps of the last generation; the KV
    cache it leaves is measured from its tensors and beside the format's formula. ``engine="auto"``: the
    compiled engine, or the eager one where the KV format has no static cache or the step does not compile;
    ``engine_options["engine_choice"]`` says which and why.
    """
    with decode_rounds(model, kv, batch_size=batch_size, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                       warmup_runs=warmup_runs, prefill_repeats=prefill_repeats, seed=seed, device=device,
                       engine=engine) as timed:
        return timed()


@contextlib.contextmanager
def decode_rounds(
    model: nn.Module, kv: KVFormat, *, batch_size: int, prompt_tokens: int, new_tokens: int,
    warmup_runs: int, prefill_repeats: int, seed: int, device: torch.device, engine: str = "eager",
) -> Iterator[Callable[[], DecodeResult]]:
    """The model made ready once (its step compiled, ``warmup_runs`` untimed generations) for rounds of timing:
    each call of what this yields times ``prefill_repeats`` prefills and one generation of ``new_tokens`` steps,
    as ``measure_decode`` does. From the second round on, one short untimed generation comes first, as the
    warm-up did in the first: other variants may have run in between (an interleaved re-timing)."""
    workload = dict(batch_size=batch_size, prompt_tokens=prompt_tokens, new_tokens=new_tokens, seed=seed,
                    prefill_repeats=prefill_repeats)
    ids = prompt_ids(model.config.vocab_size, batch_size, prompt_tokens, seed, device)
    with contextlib.ExitStack() as stack:
        decode, choice = _ready(model, kv, device, engine, prompt_tokens + new_tokens, stack,
                                lambda d: _warm_up(d, ids, new_tokens, warmup_runs))
        rounds = 0

        def timed() -> DecodeResult:
            nonlocal rounds
            if rounds:
                _warm_up(decode, ids, new_tokens, min(warmup_runs, 1))
            rounds += 1
            result = _measure_decode(decode, **workload)
            if choice is not None:
                result.engine_options["engine_choice"] = choice
            return result

        yield timed


def _warm_up(decode: "DecodeEngine", ids: torch.Tensor, new_tokens: int, runs: int) -> None:
    for _ in range(max(runs, int(decode.compiled))):  # compiled: compilation happens in the first
        decode.warm_up(ids, min(new_tokens, 8))


def _ready(model: nn.Module, kv: KVFormat, device: torch.device, engine: str, max_cache_len: int,
           stack: contextlib.ExitStack, warm_up: Callable[["DecodeEngine"], None]) -> tuple["DecodeEngine", str | None]:
    """The engine entered on ``stack`` and warmed up; with ``auto`` the compiled one, or the eager one where the KV
    format has no static cache or the step does not compile, and the choice with its reason (else None)."""
    if engine != AUTO:
        decode = stack.enter_context(DecodeEngine(model, kv, device, engine, max_cache_len))
        warm_up(decode)
        return decode, None
    reason = kv_static_problem(kv, model)
    if reason is None:
        compiled = contextlib.ExitStack()
        try:
            decode = compiled.enter_context(DecodeEngine(model, kv, device, "compiled", max_cache_len))
            warm_up(decode)
            stack.push(compiled)
            return decode, "auto: compiled"
        except COMPILE_ERRORS as e:
            compiled.close()
            reason = f"the step did not compile ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
    decode = stack.enter_context(DecodeEngine(model, kv, device, "eager", max_cache_len))
    warm_up(decode)
    return decode, f"auto: eager, {reason}"


def kv_static_problem(kv: KVFormat, model: nn.Module) -> str | None:
    """Why ``kv`` has no static cache for this model (the compiled engine cannot take it), or None."""
    try:
        kv.make_cache(model.config, 2)
    except UnsupportedError as e:
        return str(e)
    return None


def _compile_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [torch._dynamo.exc.TorchDynamoException]
    try:
        from torch._inductor.exc import InductorError

        errors.append(InductorError)
    except ImportError:  # older torch: inductor errors arrive as BackendCompilerFailed
        pass
    return tuple(errors)


COMPILE_ERRORS = _compile_errors()


def _measure_decode(
    decode: DecodeEngine, *, batch_size: int, prompt_tokens: int, new_tokens: int, prefill_repeats: int, seed: int,
) -> DecodeResult:
    """Time ``prefill_repeats`` prefills and one generation of ``new_tokens`` steps (the engine warmed up)."""
    model, kv, device = decode.model, decode.kv, decode.device
    ids = prompt_ids(model.config.vocab_size, batch_size, prompt_tokens, seed, device)
    prefills = [decode.generation().prefill(ids) for _ in range(prefill_repeats - 1)]
    gen = decode.generation()
    spans = cuda_devices_of(model) if device.type == "cuda" else None
    prefill_peak, decode_peak = PeakMemory(device, cuda_devices=spans), PeakMemory(device, cuda_devices=spans)
    with prefill_peak.track():
        prefills.append(gen.prefill(ids))
    with decode_peak.track(), watch_machine(f"decode {batch_size}x{prompt_tokens}") as load:
        steps = gen.decode(new_tokens)
    embedding = model.get_input_embeddings()  # its output dtype: a table's, or a lookup in ggml blocks' (BlockEmbedding)
    dtype = embedding.weight.dtype if isinstance(getattr(embedding, "weight", None), torch.Tensor) else embedding.dtype
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
        "kv_cache_bytes_analytic": kv.cache_bytes_analytic(model.config, batch_size, prompt_tokens + new_tokens, dtype,
                                                           static=decode.max_cache_len is not None),
        "kv_cache_tokens": prompt_tokens + new_tokens,
    }
    options = dict(decode.options) if decode.compiled else {
        "cache": type(gen.cache).__name__, "compiled": False, **decode.options,
        **({"kv_layers": "static: global layers' decode rows read the stored codes"} if decode.max_cache_len is not None else {})}
    return DecodeResult(statistics.median(prefills), steps, memory, decode.name, options, load[0].record())
