"""transformers' own ``QuantizedCache`` (backends optimum-quanto or HQQ) as a KV format, so a report can put
it beside quantlab's packed caches. Its layers re-quantize the whole history each time the residual window
fills (transformers' design); bytes are measured from the backend's tensors, with no analytic figure."""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field

if TYPE_CHECKING:
    from transformers import Cache, PretrainedConfig

from ..errors import UnsupportedError
from .format import KV_FORMATS, KVFormat


def tensor_bytes(x: object) -> int:
    """Bytes of a tensor, or of the inner tensors of a tensor subclass (quanto's packed tensors)."""
    if hasattr(x, "__tensor_flatten__"):
        names, _ = x.__tensor_flatten__()
        return sum(tensor_bytes(getattr(x, name)) for name in names)
    if isinstance(x, torch.Tensor):
        return x.untyped_storage().nbytes()
    if isinstance(x, (tuple, list)):
        return sum(tensor_bytes(item) for item in x)
    if isinstance(x, dict):
        return sum(tensor_bytes(item) for item in x.values())
    return 0


@KV_FORMATS.register("hf-quantized", "transformers' QuantizedCache; fields: backend (quanto | hqq), bits, group_size, "
                     "residual_tokens")
class HFQuantizedKV(KVFormat):
    backend: Literal["quanto", "hqq"] = "quanto"
    bits: int = Field(4, ge=1, le=8, description="quanto: 2 or 4")
    group_size: int = Field(64, gt=0)
    residual_tokens: int = Field(128, ge=1)

    @property
    def label(self) -> str:
        return f"hf-{self.backend}-int{self.bits}-g{self.group_size}-r{self.residual_tokens}"

    def missing_dependency(self) -> str | None:
        import importlib.util

        module, install = ("optimum.quanto", "pip install 'quantlab[kv]'") if self.backend == "quanto" else \
            ("hqq", "pip install hqq")
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package (optimum) is missing
            found = False
        return None if found else f"KV format {self.label} needs {module.split('.')[-1]}: {install}"

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        from transformers import QuantizedCache

        if max_cache_len is not None:
            raise UnsupportedError(f"KV format {self.label} has no static cache; use engine eager")
        try:
            return QuantizedCache(backend=self.backend, config=config, nbits=self.bits, q_group_size=self.group_size,
                                  residual_length=self.residual_tokens)
        except ImportError as e:
            package = "optimum-quanto" if self.backend == "quanto" else "hqq"
            raise UnsupportedError(f"KV format {self.label} needs {package}: {e}") from None

    def cache_bytes(self, cache: Cache) -> int:
        from .hf_compat import quantized_layer_tensors

        total = 0
        for layer in cache.layers:
            for tensor in quantized_layer_tensors(layer):
                total += tensor_bytes(tensor)
        return total

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype,
                             static: bool = False) -> None:
        return None  # the backend decides its layout
