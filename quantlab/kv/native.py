"""The model's own cache: transformers ``DynamicCache`` in the model's compute dtype."""
from __future__ import annotations

import torch
from transformers import Cache, DynamicCache, PretrainedConfig, StaticCache

from .format import KV_FORMATS, KVFormat


@KV_FORMATS.register("native", "transformers DynamicCache (StaticCache when compiled), keys and values in the model's compute dtype")
class NativeKV(KVFormat):
    @property
    def label(self) -> str:
        return "native"

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        if max_cache_len is not None:
            return StaticCache(config=config, max_cache_len=max_cache_len)
        return DynamicCache(config=config)

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype) -> int:
        """2 (K and V) x layers x KV heads x head dim x tokens x batch x element size; sliding-window
        layers of a DynamicCache keep at most their window."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        kinds = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        window = getattr(text, "sliding_window", None)
        per_token = 2 * heads * head_dim * batch_size * torch.tensor([], dtype=dtype).element_size()
        return sum(per_token * (min(tokens, window) if kind == "sliding_attention" and window else tokens) for kind in kinds)
