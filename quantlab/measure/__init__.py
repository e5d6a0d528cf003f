"""Measurements' tensor-level code. Importing this package registers the perplexity protocols."""
from . import lm_eval_protocol, perplexity  # noqa: F401  (registration)
from .protocols import PERPLEXITY_PROTOCOLS, PerplexityProtocol

__all__ = ["PERPLEXITY_PROTOCOLS", "PerplexityProtocol"]
