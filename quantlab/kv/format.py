"""The KV-cache format interface: a validated config that builds a transformers ``Cache``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # transformers loads on first use, so validating a recipe does not import it
    from transformers import Cache, PretrainedConfig

from ..registry import Registry


class KVFormat(BaseModel):
    """Base of every KV-cache format. Subclasses are registered in ``KV_FORMATS``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    example_fields: ClassVar[dict[str, Any] | None] = {}  # a small instance's fields, for the contract test
    dequantizes_on_read: ClassVar[bool] = False  # its static cache computes keys and values from stored codes

    @property
    def label(self) -> str:
        raise NotImplementedError

    def check(self, config: PretrainedConfig) -> str | None:
        """Why this format cannot serve a model of this config (checked before a run starts), or None."""
        return None

    def full_precision_tokens(self, tokens: int) -> int | None:
        """How many of ``tokens`` cached positions this format keeps unquantized in a global layer (its recent
        residual window), or None when it quantizes none apart (a cast) or the backend decides."""
        residual = getattr(self, "residual_tokens", None)
        return min(residual, tokens) if isinstance(residual, int) and residual > 0 else None

    def missing_dependency(self) -> str | None:
        """What to install when a package this format needs is missing, or None; asked before a run starts."""
        return None

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        """The cache type a serving engine would hold this format's layers in: engine name (``llama.cpp``,
        ``vllm``) -> (its type name, whether it stores what this format stores); an engine it has none in is
        absent."""
        return {}

    def serving_cache_sides(self) -> dict[str, tuple[tuple[str, bool], tuple[str, bool]]]:
        """``serving_caches`` for keys and for values: engine -> (keys' type, values' type), each (name, exact)."""
        return {engine: (found, found) for engine, found in self.serving_caches().items()}

    def check_positions(self, positions: int) -> tuple[str, str] | None:
        """``(field, problem)`` when a cache holding at most ``positions`` positions (the run's longest generation
        or cache-read window) would store none of them in this format, or None."""
        residual = getattr(self, "residual_tokens", None)
        if isinstance(residual, int) and residual >= positions:
            return ".residual_tokens", (f"{residual} recent positions kept in full precision, but the run holds at most "
                                        f"{positions}: nothing would be stored as {self.label}; use fewer than "
                                        f"{positions}")
        return None

    @property
    def calibrates(self) -> bool:
        """Whether the format takes figures from the model on calibration text (static scales) before a cache is
        made; a run calls ``calibrated`` once per variant, on the variant's own quantized model."""
        return False

    def calibrated(self, model: torch.nn.Module, samples: list[torch.Tensor], source: str = "") -> "KVFormat":
        """This format with what it calibrates taken from ``model`` run on ``samples`` (token ids, each
        ``[1, seq]``; ``source`` names them in the record); the format itself when it calibrates nothing."""
        return self

    def calibration(self) -> str | None:
        """What the format calibrated and on what (recorded beside the cache's bytes), or None."""
        return None

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        """A fresh, empty cache for one generation with a model of this config; with ``max_cache_len``,
        a static one of that length (for compiled decoding)."""
        raise NotImplementedError

    def cache_bytes(self, cache: Cache) -> int:
        """Bytes held by the cache's key and value tensors (measured; bookkeeping counters excluded)."""
        seen: set[int] = set()
        total = 0
        for layer in getattr(cache, "layers", []):
            for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in seen:
                    seen.add(tensor.untyped_storage().data_ptr())
                    total += tensor.untyped_storage().nbytes()
        return total

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype,
                             static: bool = False) -> int | None:
        """Bytes the format needs for ``tokens`` positions of ``batch_size`` sequences, from the config alone
        (None where a backend decides its own layout); ``static``: in the static cache of ``tokens`` positions
        that the compiled engine preallocates."""
        raise NotImplementedError


KV_FORMATS: Registry[KVFormat] = Registry("KV-cache format")


def attention_shape(config: PretrainedConfig) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of the text model."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_hidden_layers, heads, head_dim


def layer_windows(config: PretrainedConfig) -> list[int | None]:
    """Each layer's sliding window (None: global attention). Without ``layer_types``, transformers' caches
    treat every layer as sliding when ``sliding_window`` is set (Mistral-7B-v0.1, Phi-3-mini)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    kinds = getattr(text, "layer_types", None) or [
        "sliding_attention" if window else "full_attention"] * text.num_hidden_layers
    return [window if kind == "sliding_attention" and window else None for kind in kinds]


def single_layer_config(config: PretrainedConfig, window: int | None) -> PretrainedConfig:
    """A copy of the text config with one decoder layer, of global attention (``window`` None) or sliding
    attention over ``window`` positions: a format's per-model byte formula then gives one layer's bytes."""
    import copy

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    one = copy.deepcopy(text)
    one.num_hidden_layers = 1
    one.layer_types = ["sliding_attention" if window else "full_attention"]
    if window:
        one.sliding_window = window
    return one


def layer_kv_bytes(fmt: KVFormat, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype,
                   static: bool = False) -> list[int | None]:
    """Each decoder layer's bytes in ``fmt`` for ``batch_size`` sequences of ``tokens`` positions (None where the
    format leaves its layout to a backend): its whole-model formula on a one-layer config of that layer's attention
    kind, once per kind; they sum to the whole-model figure."""
    per_kind: dict[int | None, int | None] = {}
    out = []
    for window in layer_windows(config):
        if window not in per_kind:
            per_kind[window] = fmt.cache_bytes_analytic(single_layer_config(config, window), batch_size, tokens, dtype,
                                                        static)
        out.append(per_kind[window])
    return out
