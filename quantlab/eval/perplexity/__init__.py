"""Perplexity under registered protocols, stamped on every number. Importing this package registers the
built-in protocols: windows, sliding, kv-chunked and lm-eval."""
from . import kv_chunked, lm_eval, sliding, windows  # noqa: F401  (registration)
from .base import PERPLEXITY_PROTOCOLS, PerplexityProtocol, perplexity, protocol_of, protocol_summary

__all__ = ["PERPLEXITY_PROTOCOLS", "PerplexityProtocol", "perplexity", "protocol_of", "protocol_summary"]
