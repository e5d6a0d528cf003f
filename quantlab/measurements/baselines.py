"""What a measurement computes of the baseline once per run and keeps for every variant: the divergence's
reference distributions, the generation agreement's continuations. Kept in the run folder (``baselines/``), written
whole or not at all (two processes filling the folder may both write the same state), or in this process when there
is no run folder (library use). The baseline variant writes it when it is measured; a variant that finds none
computes it by loading the baseline itself."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import torch

from ..files import atomic_write

_IN_PROCESS: dict[str, dict[str, Any]] = {}  # without a run folder: one per process, by file name


def kept_baseline(ctx: Any, prefix: str, payload: dict[str, Any],
                  compute: Callable[[torch.nn.Module], dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """``(state, key)``: the tensors ``compute(baseline model)`` gives, for the inputs ``payload`` describes (its
    hash is the key), computed once and kept as ``baselines/<prefix><key>.pt``."""
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    name = f"{prefix}{key}.pt"
    path = ctx.run_folder / "baselines" / name if ctx.run_folder is not None else None
    if path is None:
        state = _IN_PROCESS.get(name)
    else:
        state = torch.load(path, weights_only=True) if path.is_file() else None
    if state is None:
        model = ctx.baseline_model()
        state = compute(model)
        del model
        if path is None:
            _IN_PROCESS[name] = state
        else:
            atomic_write(path, lambda tmp: torch.save(state, tmp))
    return state, key
