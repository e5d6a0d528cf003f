"""Perplexity under a registered protocol, with the protocol, scored tokens and text hash stamped beside it."""
from __future__ import annotations

from typing import Any

from ..data import Text, load_text
from ..measure.perplexity import protocol_summary, tokenize
from .base import Column, Measurement, Result, register


class PerplexityResult(Result):
    perplexity: float
    perplexity_protocol: dict[str, Any]
    lm_eval_word_perplexity: float | None = None
    lm_eval_byte_perplexity: float | None = None
    lm_eval_bits_per_byte: float | None = None
    lm_eval_token_perplexity: float | None = None


@register("perplexity", "perplexity under the recipe's protocol (windows, sliding, kv-chunked, lm-eval, ...)")
class Perplexity(Measurement):
    result = PerplexityResult
    title = "perplexity"
    columns = (Column("perplexity", "perplexity", ".3f", compare="delta", higher_is_better=False),)

    def enabled(self, recipe: Any) -> bool:
        return recipe.evaluations.perplexity is not None

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        spec = ctx.recipe.evaluations.perplexity
        tokenizer = ctx.loaded.tokenizer
        text = load_text(spec.text)
        ids = tokenize(tokenizer, text)
        if spec.max_tokens is not None and ids.numel() > spec.max_tokens:
            ids = ids[: spec.max_tokens]
            text = Text(f"{text.source}[:{spec.max_tokens} tokens]", tokenizer.decode(ids))
        return PerplexityResult(**spec.runner.run(ctx.model, tokenizer, ids, text, spec, ctx.variant.kv, ctx.device))

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        proto = row.get("perplexity_protocol")
        return f"token perplexity, protocol {protocol_summary(proto)}." if proto else None
