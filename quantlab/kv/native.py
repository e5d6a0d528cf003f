"""The model's own cache: transformers ``DynamicCache`` in the model's compute dtype."""
from __future__ import annotations

from transformers import Cache, DynamicCache, PretrainedConfig

from .format import KV_FORMATS, KVFormat


@KV_FORMATS.register("native", "transformers DynamicCache, keys and values in the model's compute dtype")
class NativeKV(KVFormat):
    @property
    def label(self) -> str:
        return "native"

    def make_cache(self, config: PretrainedConfig) -> Cache:
        return DynamicCache(config=config)
