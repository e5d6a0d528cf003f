"""Protocol ``windows``: join the text, tokenize once, score non-overlapping windows, each from an empty context
(the GPTQ paper's protocol; the tail shorter than a window is dropped)."""
from __future__ import annotations

from .base import PERPLEXITY_PROTOCOLS, PerplexityProtocol, perplexity


@PERPLEXITY_PROTOCOLS.register("windows", "disjoint windows, each from an empty context (the GPTQ paper's)")
class Windows(PerplexityProtocol):
    def run(self, model, tokenizer, ids, text, kv, device):  # type: ignore[no-untyped-def]
        return perplexity(model, ids, text, protocol="windows", window_tokens=self.window_tokens,
                          batch_size=self.batch_size, device=device)
