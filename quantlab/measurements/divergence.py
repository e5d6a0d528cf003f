"""KL divergence, top-1 agreement and Δ perplexity against the baseline variant (as llama.cpp's
``--kl-divergence`` reports them), on disjoint windows of the perplexity text.

The baseline's distributions are computed once per run and kept in the run folder (``baselines.kept_baseline``).
"""
from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from ..eval.base import Evaluation
from ..eval.tokens import scored_text, token_ids_sha256
from ..fidelity.divergence import Reference, compare, noise_floor, reference
from .base import Column, Measurement, Result, register
from .baselines import kept_baseline


class DivergenceEval(Evaluation):
    """Next-token distributions against the baseline variant's, on disjoint windows of the perplexity text."""

    requires = ("perplexity",)

    top_k: int | None = Field(None, ge=1, description="null (default): the baseline's whole vocabulary, exact; k: only "
                              "its k largest log-probabilities per position and the rest as one bucket, a lower bound "
                              "of the KL that keeps k / vocabulary of the bytes")
    window_tokens: int | None = Field(None, ge=2, description="default: the perplexity evaluation's")
    max_tokens: int | None = Field(None, ge=2, description="default: the perplexity evaluation's")
    batch_size: int = Field(4, ge=1, description="windows per forward pass")
    noise_floor: bool = Field(True, description="score the (unquantized) baseline against itself computed in another "
                              "dtype (bfloat16 for a float32 baseline), once, as the level no variant can be told from")


class DivergenceResult(Result):
    kl_divergence_mean: float
    kl_divergence_median: float
    kl_divergence_p90: float
    kl_divergence_p99: float
    kl_divergence_max: float
    top1_agreement_percent: float
    next_token_prob_rms_diff: float
    delta_perplexity: float
    delta_perplexity_ci95_low: float
    delta_perplexity_ci95_high: float
    divergence_protocol: dict[str, Any]
    # llama.cpp's statistics (fidelity/statistics.py); absent from records written before them
    kl_divergence_mean_uncertainty: float | None = None
    kl_divergence_p999: float | None = None
    kl_divergence_quantiles: dict[str, float] | None = None  # llama-perplexity's: max, 99.9 ... 0.1, min
    delta_p_mean_percent: float | None = None
    delta_p_mean_uncertainty_percent: float | None = None
    delta_p_rms_percent: float | None = None
    delta_p_rms_uncertainty_percent: float | None = None
    delta_p_quantiles_percent: dict[str, float] | None = None
    same_top_p_percent: float | None = None
    same_top_p_uncertainty_percent: float | None = None
    ln_ppl_ratio_mean: float | None = None
    ln_ppl_ratio_uncertainty: float | None = None
    ln_ppl_correlation_percent: float | None = None
    confidence_splits: dict[str, dict[str, float]] | None = None  # by the baseline's probability of its top token
    divergence_windows: dict[str, list[float]] | None = None  # per window: mean KL, mean NLL (paired comparisons)
    noise_floor: dict[str, Any] | None = None  # the baseline's row: itself through another dtype (fidelity.noise_floor)


def _spec(recipe: Any) -> tuple[Any, int, int | None]:
    d, p = recipe.evaluations.divergence, recipe.evaluations.perplexity
    return d, d.window_tokens or p.window_tokens, d.max_tokens or p.max_tokens


def _unquantized(model: Any) -> bool:
    """Whether ``model`` is a torch model holding no quantized layer (one a dtype cast reproduces)."""
    from ..quant.linear import QuantizedLinear

    return isinstance(model, torch.nn.Module) and not any(isinstance(m, QuantizedLinear) for m in model.modules())


@register("divergence", "KL divergence, top-1 agreement and Δ perplexity against the baseline variant")
class Divergence(Measurement):
    order = 90
    result = DivergenceResult
    evaluation = DivergenceEval
    title = "divergence from the baseline"
    section = "Divergence from the baseline"
    columns = (
        Column("kl_divergence_mean", "KL mean", ".5f", higher_is_better=False),
        Column("kl_divergence_mean_uncertainty", "KL mean ±σ", ".5f"),
        Column("kl_divergence_median", "KL median", ".5f", higher_is_better=False),
        Column("kl_divergence_p90", "KL p90", ".5f", higher_is_better=False),
        Column("kl_divergence_p99", "KL p99", ".4f", higher_is_better=False),
        Column("kl_divergence_p999", "KL p99.9", ".4f", higher_is_better=False),
        Column("kl_divergence_max", "KL max", ".4f", higher_is_better=False),
        Column("top1_agreement_percent", "top-1 same %", ".2f", higher_is_better=True),
        Column("same_top_p_percent", "same top p %", ".2f", higher_is_better=True),
        Column("delta_p_mean_percent", "Δp mean %", "+.3f"),
        Column("delta_p_rms_percent", "RMS Δp %", ".3f", higher_is_better=False),
        Column("ln_ppl_ratio_mean", "ln(PPL/PPL base)", "+.5f", higher_is_better=False),
        Column("delta_perplexity", "Δppl (95% interval)", "+.3f", higher_is_better=False,
               spread=("delta_perplexity_ci95_low", "delta_perplexity_ci95_high")),
    )

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        spec, window, max_tokens = _spec(ctx.recipe)
        ids, text = scored_text(ctx.recipe.evaluations.perplexity.text, ctx.tokenizer, max_tokens)
        payload = {"baseline": ctx.recipe.baseline_variant.key, "window_tokens": window, "top_k": spec.top_k,
                   "tokens": token_ids_sha256(ids)}
        state, key = kept_baseline(ctx, "", payload, lambda model: reference(
            model, ids, window, spec.batch_size, ctx.device, spec.top_k).state())
        ref = Reference.from_state(state)
        figures = compare(ctx.scoring_model, ids, ref, spec.batch_size, ctx.device)
        if spec.noise_floor and ctx.variant.label == ctx.recipe.baseline_label and _unquantized(ctx.scoring_model):
            figures["noise_floor"] = noise_floor(ctx.scoring_model, ids, ref, spec.batch_size, ctx.device)
        protocol = {"baseline": ctx.recipe.baseline_label, "windows": figures.pop("windows"),
                    "window_tokens": window, "scored_tokens": figures.pop("scored_tokens"),
                    "top_k": spec.top_k, "baseline_rest_mass_mean": figures.pop("baseline_rest_mass_mean"),
                    "baseline_perplexity": figures.pop("baseline_perplexity"), "reference": key,
                    "text": text.source, "text_sha256": text.sha256}
        return DivergenceResult(**figures, divergence_protocol=protocol)

    def reads_kv_cache(self, row: dict[str, Any]) -> bool | None:
        return False  # whole windows through the model, no cache

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        p = row.get("divergence_protocol")
        if not p:
            return None
        kept = "the whole vocabulary (exact)" if p["top_k"] is None else (
            f"the top {p['top_k']} tokens plus one bucket for the rest, so every KL figure is a LOWER BOUND (mean "
            f"baseline mass outside the top {p['top_k']}: {p['baseline_rest_mass_mean']:.2e})")
        return (f"KL(baseline ‖ variant) per position against {p['baseline']} over {p['scored_tokens']} tokens in "
                f"{p['windows']} windows of {p['window_tokens']} ({p['text']}), from {kept}; top-1 agreement: some "
                "token is most likely under both (ties for first overlap); same top p, Δp (the change in the "
                "probability of the next token), ±σ and percentiles with llama-perplexity's estimators; Δ perplexity "
                "with a 95% interval from the per-window paired differences.")
