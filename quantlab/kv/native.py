"""The model's own cache: transformers ``DynamicCache`` in the model's compute dtype."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import Cache, PretrainedConfig

from .format import KV_FORMATS, KVFormat, attention_shape, layer_windows


@KV_FORMATS.register("native", "transformers DynamicCache (static layers when compiled), keys and values in the model's "
                     "compute dtype")
class NativeKV(KVFormat):
    @property
    def label(self) -> str:
        return "native"

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        return {"llama.cpp": ("f16", True), "vllm": ("auto", True)}  # the model's dtype (llama.cpp: f16 by default)

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        if max_cache_len is not None:
            from transformers import Cache

            from .hf_compat import StaticLayer
            from .static import StaticPackedSlidingLayer

            return Cache(layers=[StaticLayer(max_cache_len) if window is None
                                 else StaticPackedSlidingLayer.full_precision(max_cache_len, window)
                                 for window in layer_windows(config)])
        from transformers import DynamicCache

        return DynamicCache(config=config)

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype,
                             static: bool = False) -> int:
        """2 (K and V) x layers x KV heads x head dim x tokens x batch x element size; sliding-window
        layers keep at most their window (a StaticCache of ``tokens`` positions holds the same)."""
        _, heads, head_dim = attention_shape(config)
        per_token = 2 * heads * head_dim * batch_size * dtype.itemsize
        return sum(per_token * (tokens if window is None else min(tokens, window)) for window in layer_windows(config))
