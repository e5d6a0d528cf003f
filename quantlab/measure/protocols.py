"""Perplexity protocols, registered by name like formats: ``PERPLEXITY_PROTOCOLS["windows"]``.

A protocol scores a token stream (or, for lm-eval, the text itself) and returns the perplexity with the
protocol stamped beside it. The recipe names one with ``evaluations.perplexity.protocol``; adding one is a
class with ``@PERPLEXITY_PROTOCOLS.register(name, summary)`` in a module imported by ``measure/__init__``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..data import Text


class PerplexityProtocol:
    """How a perplexity is obtained. ``spec`` is the recipe's ``evaluations.perplexity`` section."""

    reads_kv_cache: ClassVar[bool] = False  # whether the figure depends on the KV format

    def check(self, spec: Any) -> str | None:
        """Why ``spec`` does not fit this protocol, or None."""
        return None

    def run(self, model: "nn.Module", tokenizer: Any, ids: "torch.Tensor", text: "Text", spec: Any, kv: Any,
            device: "torch.device") -> dict[str, Any]:
        """``{"perplexity": float, "perplexity_protocol": {...}, ...}`` for the model on ``ids`` / ``text``."""
        raise NotImplementedError


PERPLEXITY_PROTOCOLS: Registry[PerplexityProtocol] = Registry("perplexity protocol")
