"""Every place quantlab's KV caches touch transformers' cache internals, in one module.

The packed formats subclass transformers' cache layers (``DynamicLayer``, ``DynamicSlidingWindowLayer``, and for
the compiled engine ``StaticLayer``, ``StaticSlidingWindowLayer``: their ``cumulative_length`` counters) and
call what those layers do not publish as API (and the forward argument a cache is passed in, ``cache_kwarg``): ``lazy_initialization`` (one argument before transformers 5.0,
keys and values since), the sliding layer's ``cumulative_length`` counter, and ``QuantizedCache``'s
``_quantized_keys`` / ``_quantized_values``. The supported range is in pyproject.toml; CI runs the KV and runner
tests on its oldest transformers as well.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
from transformers.cache_utils import (  # noqa: F401  (re-exported bases)
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
)

QUANTIZED_LAYER_TENSORS = ("_quantized_keys", "_quantized_values", "keys", "values")


@lru_cache(maxsize=None)
def _takes_values(cls: type) -> bool:
    return len(inspect.signature(cls.lazy_initialization).parameters) >= 3


def initialize_layer(layer: Any, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
    """``layer.lazy_initialization`` under the signature this transformers has."""
    if _takes_values(type(layer)):
        layer.lazy_initialization(key_states, value_states)
    else:
        layer.lazy_initialization(key_states)


def advance_window(layer: Any, new_tokens: int) -> int:
    """Move a sliding layer's position counter by ``new_tokens``; returns the count before."""
    before = int(layer.cumulative_length)
    layer.cumulative_length = before + new_tokens
    return before


def window_position(layer: Any) -> int:
    return int(layer.cumulative_length)


def quantized_layer_tensors(layer: Any) -> list[Any]:
    """The tensors a transformers ``QuantizedCache`` layer holds (quantized history, full-precision residual)."""
    return [getattr(layer, name, None) for name in QUANTIZED_LAYER_TENSORS]


def cache_kwarg(model: Any) -> str:
    """The forward argument that takes a Cache: ``cache`` in recent transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
