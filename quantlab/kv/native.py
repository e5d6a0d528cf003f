"""The model's own cache: transformers ``DynamicCache`` in the model's compute dtype."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import Cache, PretrainedConfig

from .format import KV_FORMATS, KVFormat, attention_shape, layer_windows


@KV_FORMATS.register("native", "transformers DynamicCache (StaticCache when compiled), keys and values in the model's compute dtype")
class NativeKV(KVFormat):
    @property
    def label(self) -> str:
        return "native"

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        if max_cache_len is not None:
            from transformers import StaticCache

            return StaticCache(config=config, max_cache_len=max_cache_len)
        from transformers import DynamicCache

        return DynamicCache(config=config)

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype) -> int:
        """2 (K and V) x layers x KV heads x head dim x tokens x batch x element size; sliding-window
        layers of a DynamicCache keep at most their window."""
        _, heads, head_dim = attention_shape(config)
        per_token = 2 * heads * head_dim * batch_size * dtype.itemsize
        return sum(per_token * (tokens if window is None else min(tokens, window)) for window in layer_windows(config))
