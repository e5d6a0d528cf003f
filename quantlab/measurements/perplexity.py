"""Perplexity under a registered protocol, with the protocol, scored tokens and text hash stamped beside it."""
from __future__ import annotations

from typing import Any

from ..data import Text, load_text
from ..measure.perplexity import protocol_summary, tokenize
from .base import Column, Measurement, Result, register


def scored_text(source: Any, tokenizer: Any, max_tokens: int | None) -> tuple[Any, Text]:
    """The token ids of a recipe's text, cut to ``max_tokens``, and the text they are (named for the cut)."""
    text = load_text(source)
    ids = tokenize(tokenizer, text)
    if max_tokens is not None and ids.numel() > max_tokens:
        ids = ids[:max_tokens]
        text = Text(f"{text.source}[:{max_tokens} tokens]", tokenizer.decode(ids))
    return ids, text


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
        ids, text = scored_text(spec.text, ctx.loaded.tokenizer, spec.max_tokens)
        return PerplexityResult(**spec.runner.run(ctx.model, ctx.loaded.tokenizer, ids, text, spec, ctx.variant.kv,
                                                  ctx.device))

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        proto = row.get("perplexity_protocol")
        return f"token perplexity, protocol {protocol_summary(proto)}." if proto else None
