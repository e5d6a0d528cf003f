"""Protocol ``sliding``: windows every ``stride_tokens``, each token scored once with up to window - stride tokens
of context before it (HF's "perplexity of fixed-length models")."""
from __future__ import annotations

from pydantic import Field, model_validator

from .base import PERPLEXITY_PROTOCOLS, PerplexityProtocol, perplexity


@PERPLEXITY_PROTOCOLS.register("sliding", "windows every stride_tokens, each token scored once (HF's fixed-length)")
class Sliding(PerplexityProtocol):
    stride_tokens: int | None = Field(None, ge=1, description="tokens between window starts (1 to window_tokens)")

    @model_validator(mode="after")
    def _stride_within_window(self) -> "Sliding":
        if self.stride_tokens is None or self.stride_tokens > self.window_tokens:
            raise ValueError("protocol sliding needs stride_tokens between 1 and window_tokens")
        return self

    def run(self, model, tokenizer, ids, text, kv, device):  # type: ignore[no-untyped-def]
        return perplexity(model, ids, text, protocol="sliding", window_tokens=self.window_tokens,
                          stride_tokens=self.stride_tokens, batch_size=self.batch_size, device=device)
