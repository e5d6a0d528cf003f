"""Static KV-cache scales from calibration text: the largest magnitude each layer's cache receives per KV head
(keys after the rotary embedding, as they are stored), the statistic llm-compressor's KV-cache observers and
vLLM's ``calculate_kv_scales`` take."""
from __future__ import annotations

from typing import Callable

import torch

Transform = Callable[[torch.Tensor], torch.Tensor]


def kv_absmax(model: torch.nn.Module, samples: list[torch.Tensor], key_transform: Transform | None = None,
              value_transform: Transform | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per decoder layer, ``(keys, values)`` maxima of ``|x|`` per KV head (float32 ``[H]``) over every position
    of ``samples`` (token ids ``[1, seq]``), keys and values passed through their transforms first (a rotation
    applied before storing). Sliding-window layers see every position too: the cache's window is taken after the update."""
    from transformers import DynamicCache

    maxima: dict[int, list[torch.Tensor]] = {}

    def recorder(index: int, update: Callable) -> Callable:
        def record(keys: torch.Tensor, values: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
            seen = [(f(x) if f is not None else x).detach().float().abs().amax(dim=(0, 2, 3))
                    for x, f in ((keys, key_transform), (values, value_transform))]
            maxima[index] = seen if index not in maxima else [torch.maximum(a, b) for a, b in zip(maxima[index], seen)]
            return update(keys, values, *args, **kwargs)
        return record

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for ids in samples:
                cache = DynamicCache(config=model.config)
                for i, layer in enumerate(cache.layers):
                    layer.update = recorder(i, layer.update)
                model(ids.to(device), past_key_values=cache, use_cache=True)
    finally:
        model.train(was_training)
    if not maxima:
        raise ValueError("no calibration sample reached the KV cache")
    return [(maxima[i][0].cpu(), maxima[i][1].cpu()) for i in sorted(maxima)]
