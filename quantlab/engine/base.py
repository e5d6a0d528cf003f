"""The engine interface and its registry: what measures a variant's decode and, for an engine outside this process,
serves its quality evaluations too. Each engine lives in a folder of its own (``torch/``, ``llama_cpp/``) and
registers itself with one line; a recipe's ``workload.engine`` names registered engines.

An engine says, before any work, what it cannot measure of a recipe (``refuse``) and what must be installed for it
(``missing``); how it names a KV format's cache (``cache_type``); and either decodes a model quantlab holds in this
process (``decode``) or serves the variant from outside it (``serve``: decode timing, window scores and the weight
components of what it runs). Its rows' provenance sentences come from it too (``note``).
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Literal, Protocol

import torch

from ..registry import Registry

if TYPE_CHECKING:
    from torch import nn


@dataclass
class DecodeResult:
    prefill_ms: float
    decode_ms: list[float] = field(repr=False)
    memory: dict[str, Any] = field(default_factory=dict)

    engine: str = "eager"
    engine_options: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)  # MachineLoad.record() of the timed decode
    rounds: int = 1  # timed generations pooled (``pooled``): several when interleaved with other variants'
    interleaved_variants: int = 1  # the variants whose rounds alternated with these (this one included)

    @classmethod
    def pooled(cls, results: list["DecodeResult"], interleaved_variants: int = 1) -> "DecodeResult":
        """One result from rounds of the same generation timed apart (interleaved with other variants'): every
        round's decode steps together, the median round's prefill, the last round's memory, and the machine as the
        worst round saw it (highest load and concurrency, smallest CPU share)."""
        first, machines = results[0], [r.machine for r in results if r.machine]

        def worst(key: str, pick: Callable[..., Any]) -> Any:
            values = [m[key] for m in machines if m.get(key) is not None]
            return pick(values) if values else None

        machine = dict(machines[-1]) if machines else {}
        machine.update({k: v for k, v in (("load_average_1m", worst("load_average_1m", max)),
                                          ("process_cpu_share", worst("process_cpu_share", min)),
                                          ("concurrent_timed_runs", worst("concurrent_timed_runs", max)))
                        if v is not None})
        return cls(statistics.median(r.prefill_ms for r in results), [t for r in results for t in r.decode_ms],
                   results[-1].memory, first.engine, first.engine_options, machine, len(results), interleaved_variants)

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
            **({"timing_rounds": self.rounds, "timing_interleaved_variants": self.interleaved_variants}
               if self.rounds > 1 else {}),
            **self.machine,
            **self.memory,
        }


def prompt_ids(vocab_size: int, batch_size: int, prompt_tokens: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, prompt_tokens), generator=g).to(device)




class Served(Protocol):
    """A variant held by an engine outside this process, for the measurements that read it."""

    kernel_path: str
    lm: Any  # what quality evaluations call as the model: ``lm(input_ids=[b, w]).logits``

    def decode(self, config: Any, *, batch_size: int, prompt_tokens: int, new_tokens: int, warmup_runs: int,
               prefill_repeats: int, seed: int) -> DecodeResult: ...

    def weight_components(self) -> dict[str, int]: ...

    def generate(self, prompts: Any, steps: int, follow: Any = None) -> tuple[Any, Any]:
        """Greedy continuations through the engine's own cache: ``(tokens [N, steps], log-probabilities [N, steps,
        vocab])`` (``follow``: its tokens taken instead, teacher-forced). Optional: a served variant without it is
        refused by the evaluations that need it (``Engine.serves_generation``)."""

    def close(self) -> None: ...


Figure = Literal["latency", "weights"]


class Engine:
    """Base of registered engines. Subclasses set ``in_process`` and implement ``decode`` (in this process) or
    ``serve`` (outside it)."""

    in_process: ClassVar[bool] = True  # True: decodes the model quantlab holds; False: serves its own copy
    serves_generation: ClassVar[bool] = True  # greedy continuations (in process: the model; else ``Served.generate``)

    def missing(self) -> str | None:
        """What to install when this engine cannot run here (one line), or None."""
        return None

    def refuse(self, recipe: Any) -> tuple[str, str] | None:
        """``(field path, why)`` when this engine cannot measure the recipe as written; asked when it is validated."""
        return None

    def cache_type(self, kv: Any) -> str | None:
        """The name of the cache holding KV format ``kv`` in this engine, or None when it has none."""
        return kv.label

    def decode(self, model: "nn.Module", kv: Any, device: torch.device, **workload: Any) -> DecodeResult:
        """Warm up and time one generation of ``model`` with ``kv``'s cache at one workload point."""
        raise NotImplementedError(f"{type(self).__name__} serves variants outside this process")

    @contextlib.contextmanager
    def decode_rounds(self, model: "nn.Module", kv: Any, device: torch.device,
                      **workload: Any) -> Iterator[Callable[[], DecodeResult]]:
        """``decode`` made ready once for several timed rounds, between which other variants run (an interleaved
        re-timing): each call of what it yields times one generation as ``decode`` does. This default makes each
        round a whole ``decode``; an engine that compiles overrides it to compile once."""
        yield lambda: self.decode(model, kv, device, **workload)

    def serve(self, ctx: Any) -> Served:
        """The variant (``ctx``: its lifecycle, model quantized) held by this engine outside this process."""
        raise NotImplementedError(f"{type(self).__name__} decodes in this process")

    def note(self, rows: list[dict[str, Any]], figure: Figure) -> str:
        """A sentence for "how these figures were obtained" on ``figure`` of the rows this engine measured."""
        return ""


ENGINES: Registry[Engine] = Registry("engine")


def engine(name: str) -> Engine:
    """The registered engine ``name`` (an unknown name is one line naming the known ones)."""
    return ENGINES[name].build()
