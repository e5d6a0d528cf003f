"""Perplexity under a registered protocol, with the protocol, scored tokens and text hash stamped beside it."""
from __future__ import annotations

from typing import Any

from pydantic import create_model

from ..eval.perplexity import PERPLEXITY_PROTOCOLS, PerplexityProtocol, protocol_summary
from ..eval.tokens import scored_text
from .base import Column, Measurement, Result, register


class PerplexityFigure(Result):
    perplexity: float
    perplexity_protocol: dict[str, Any]


def _result_model() -> type[Result]:
    """The figure and the stamp, plus every field a registered protocol reports besides them (optional)."""
    extras = {name: (info.annotation, None) for entry in PERPLEXITY_PROTOCOLS.entries()
              if entry.cls.extra_result is not None for name, info in entry.cls.extra_result.model_fields.items()}
    return create_model("PerplexityResult", __base__=PerplexityFigure, **extras)  # type: ignore[call-overload]


PerplexityResult = _result_model()


@register("perplexity", "perplexity under the recipe's protocol (windows, sliding, kv-chunked, lm-eval, ...)")
class Perplexity(Measurement):
    order = 80
    result = PerplexityResult
    evaluation = PerplexityProtocol
    title = "perplexity"
    columns = (Column("perplexity", "perplexity", ".3f", compare="delta", higher_is_better=False),)

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        spec = ctx.recipe.evaluations.perplexity
        ids, text = scored_text(spec.text, ctx.tokenizer, spec.max_tokens)
        return PerplexityResult(**spec.run(ctx.scoring_model, ctx.tokenizer, ids, text, ctx.variant.kv,
                                           ctx.device))

    def reads_kv_cache(self, row: dict[str, Any]) -> bool | None:
        name = (row.get("perplexity_protocol") or {}).get("name")
        return bool(PERPLEXITY_PROTOCOLS[name].cls.reads_kv_cache) if name in PERPLEXITY_PROTOCOLS else None

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        proto = row.get("perplexity_protocol")
        return f"token perplexity, protocol {protocol_summary(proto)}." if proto else None
