"""Greedy generation agreement through the variant's KV cache: from prompts of the perplexity text at the
workload's first context length, the baseline and the variant each generate tokens greedily, each through its own
cache; recorded are the mean number of tokens before their continuations first differ, the share that are
identical, and the KL of the variant's next-token distribution along the baseline's continuation (the variant
teacher-forced on it, through its cache). A KV format that looks harmless teacher-forced over short windows can
still derail a long greedy generation; this is where it shows.

A variant an engine serves outside this process generates through that engine's own cache (``Served.generate``).
The baseline's continuations and distributions are computed once per run and kept in the run folder
(``baselines/generation-<key>.pt``, ``baselines.kept_baseline``), as the divergence reference is."""
from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from ..eval.base import Evaluation
from ..eval.generation import agreement, decode, prompt_windows
from ..eval.tokens import scored_text, token_ids_sha256
from .base import Column, Measurement, Result, register
from .baselines import kept_baseline


class GenerationEval(Evaluation):
    """Greedy continuations of the variant against the baseline's, through each one's KV cache."""

    requires = ("perplexity",)

    prompts: int = Field(4, ge=1, description="prompts taken from the perplexity text, evenly spaced")
    prompt_tokens: int | None = Field(None, ge=1, description="tokens per prompt; default: the workload's first "
                                      "prompt length")
    new_tokens: int = Field(32, ge=1, description="tokens each model generates greedily per prompt")

    def engine_refusal(self, engine: Any) -> str | None:
        if not getattr(engine, "serves_generation", True):
            return "this engine serves no greedy continuations (Served.generate)"
        return None


class GenerationResult(Result):
    generation_tokens_to_first_difference_mean: float
    generation_identical_percent: float
    generation_kl_mean: float
    generation_kl_max: float
    generation_protocol: dict[str, Any]


def _spec(recipe: Any) -> tuple[GenerationEval, int]:
    g = recipe.evaluations.generation
    prompts = recipe.workload.prompt_tokens
    return g, g.prompt_tokens or (prompts[0] if isinstance(prompts, list) else prompts)


@register("generation", "greedy continuations through the KV cache against the baseline's: tokens to the first "
          "difference, identical share, KL along the baseline's continuation")
class Generation(Measurement):
    order = 92
    result = GenerationResult
    evaluation = GenerationEval
    title = "generation agreement"
    section = "Greedy generation against the baseline"
    columns = (
        Column("generation_tokens_to_first_difference_mean", "tokens to first difference", ".1f",
               higher_is_better=True),
        Column("generation_identical_percent", "identical continuations %", ".1f", higher_is_better=True),
        Column("generation_kl_mean", "KL along baseline continuation", ".5f", higher_is_better=False),
        Column("generation_kl_max", "KL max along it", ".4f", higher_is_better=False),
    )

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        spec, prompt_tokens = _spec(ctx.recipe)
        ids, text = scored_text(ctx.recipe.evaluations.perplexity.text, ctx.tokenizer, None)
        prompts = prompt_windows(ids, spec.prompts, prompt_tokens)
        baseline = ctx.recipe.baseline_variant
        payload = {"baseline": baseline.key, "prompts": spec.prompts, "prompt_tokens": prompt_tokens,
                   "new_tokens": spec.new_tokens, "tokens": token_ids_sha256(prompts.reshape(-1))}

        def continue_greedily(model: torch.nn.Module) -> dict[str, torch.Tensor]:
            tokens, logprobs = decode(model, prompts, baseline.kv, spec.new_tokens, ctx.device)
            return {"tokens": tokens, "logprobs": logprobs}

        ref, key = kept_baseline(ctx, "generation-", payload, continue_greedily)
        kv, served = ctx.variant.kv, ctx.served()
        if served is not None:  # an engine outside this process: its own cache
            tokens, _ = served.generate(prompts, spec.new_tokens)
            _, forced = served.generate(prompts, spec.new_tokens, follow=ref["tokens"])
        else:
            tokens, _ = decode(ctx.model, prompts, kv, spec.new_tokens, ctx.device)
            _, forced = decode(ctx.model, prompts, kv, spec.new_tokens, ctx.device, follow=ref["tokens"])
        figures = agreement(ref["tokens"], tokens, ref["logprobs"], forced)
        protocol = {"baseline": ctx.recipe.baseline_label, "prompts": spec.prompts, "prompt_tokens": prompt_tokens,
                    "new_tokens": spec.new_tokens, "kv_format": kv.label, "baseline_kv_format": baseline.kv.label,
                    "engine": getattr(ctx.variant, "engine", None),
                    "text": text.source, "reference": key}
        return GenerationResult(**figures, generation_protocol=protocol)

    def reads_kv_cache(self, row: dict[str, Any]) -> bool | None:
        return True  # every step attends to the variant's stored keys and values

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        p = row.get("generation_protocol")
        if not p:
            return None
        return (f"{p['prompts']} prompts of {p['prompt_tokens']} tokens from {p['text']}, evenly spaced; the baseline "
                f"({p['baseline']}, KV {p['baseline_kv_format']}) and each variant generate {p['new_tokens']} tokens "
                "greedily, each through its own KV cache; tokens before the first difference and identical "
                "continuations compare the two; KL(baseline ‖ variant) of the next-token distributions along the "
                "baseline's continuation, the variant teacher-forced on it through its cache.")
