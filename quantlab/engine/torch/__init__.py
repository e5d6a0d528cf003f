"""quantlab's own engines, over the model it holds in this process: ``eager`` (a greedy loop over model.forward with
the KV format's cache), ``compiled`` (a static cache and a torch.compile'd decode step) and ``auto`` (compiled where
the KV format has a static cache and the step compiles, else eager, the reason recorded). The decode loop is in
``decode.py``, the compiled step in ``compiled.py``, the attention over stored codes in ``attention.py``; they load
when a variant is measured, not when a recipe is validated."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from ..base import ENGINES, DecodeResult, Engine


class TorchEngine(Engine):
    """One of quantlab's in-process engines (``mode``: eager, compiled or auto)."""

    in_process = True

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def decode(self, model: Any, kv: Any, device: torch.device, **workload: Any) -> DecodeResult:
        from .decode import measure_decode

        return measure_decode(model, kv, device=device, engine=self.mode, **workload)

    @contextlib.contextmanager
    def decode_rounds(self, model: Any, kv: Any, device: torch.device,
                      **workload: Any) -> Iterator[Callable[[], DecodeResult]]:
        """The step compiled (or the eager loop chosen) once for every round."""
        from .decode import decode_rounds

        with decode_rounds(model, kv, device=device, engine=self.mode, **workload) as timed:
            yield timed


ENGINES.add("auto", TorchEngine, "compiled where the KV format has a static cache and the step compiles, else eager "
            "(the reason recorded)", mode="auto")
ENGINES.add("eager", TorchEngine, "a greedy loop over model.forward with the KV format's cache", mode="eager")
ENGINES.add("compiled", TorchEngine, "a static cache and a torch.compile'd decode step", mode="compiled")
