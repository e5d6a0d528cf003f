"""An importance matrix as llama.cpp's ``llama-imatrix`` makes one: for every linear, the mean over all the
calibration tokens it saw of each input column's squared activation (``Σ x_j² / tokens``), taken from the
unquantized model. ggml's quantizers weigh each weight's rounding error by its column's value."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ...progress import progress
from ..linear import linear_weight
from ..offload import execution_device


class ImatrixAccumulator:
    """Running ``Σ x_j²`` and ``Σ x_j`` (float64) and the number of rows (tokens) seen by one linear: what
    llama-imatrix keeps per tensor (``in_sum2``, ``in_sum``, ``counts``)."""

    def __init__(self, n_in: int) -> None:
        self.sum_squares = torch.zeros(n_in, dtype=torch.float64)
        self.sums = torch.zeros(n_in, dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).double()
        self.sum_squares += x.square().sum(0).cpu()
        self.sums += x.sum(0).cpu()
        self.rows += x.shape[0]

    def mean(self) -> torch.Tensor:
        """The per-column mean squared activation, float32 ``[in]`` (zeros where no token was seen)."""
        return (self.sum_squares / max(self.rows, 1)).float()


def collect_imatrix(model: nn.Module, names: list[str], samples: Iterable[torch.Tensor]) -> dict[str, ImatrixAccumulator]:
    """Each named linear's accumulator over a forward of the unquantized ``model`` on every sample (``[1, seq]``)."""
    modules = {name: model.get_submodule(name) for name in names}
    sums = {name: ImatrixAccumulator(linear_weight(m).shape[1]) for name, m in modules.items()}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: sums[name].add(args[0]))
             for name, m in modules.items()]
    device = execution_device(model.get_input_embeddings())
    samples = list(samples)
    try:
        with torch.inference_mode():
            for ids in progress(samples, "importance matrix, calibration samples"):
                model(input_ids=ids.to(device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return sums
