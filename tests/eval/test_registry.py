"""Evaluations are a registry: each entry of a recipe's ``evaluations:`` is validated by its own model, asked before
any work what it refuses and which engines it cannot run on; a new one is one class pair in one file and one
registration line, written here from outside the package."""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import Field

from quantlab import RecipeError, validate_recipe
from quantlab.extend import EVALUATIONS, MEASUREMENTS, Column, Evaluation, Measurement, Result, register_measurement

WORKLOAD = {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"}


class CountTokens(Evaluation):
    """A toy evaluation: how many tokens of the perplexity text its tokenizer makes, up to a cap."""

    requires: ClassVar[tuple[str, ...]] = ("perplexity",)
    cap_tokens: int = Field(100_000, ge=1)

    def problem(self) -> tuple[str, str] | None:
        return (".cap_tokens", "a cap of 13 is unlucky") if self.cap_tokens == 13 else None

    def engine_refusal(self, engine: Any) -> str | None:
        return None if engine.in_process else "counts with the tokenizer quantlab holds"


class TokenCount(Result):
    text_tokens: int


def _register() -> None:
    @register_measurement("token_count", "tokens of the perplexity text")  # the one registration line
    class Count(Measurement):
        order = 95
        result = TokenCount
        evaluation = CountTokens
        columns = (Column("text_tokens", "text tokens", ","),)

        def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
            from quantlab.eval.tokens import scored_text

            cap = ctx.recipe.evaluations.token_count.cap_tokens
            ids, _ = scored_text(ctx.recipe.evaluations.perplexity.text, ctx.tokenizer, cap)
            return TokenCount(text_tokens=ids.numel())


@pytest.fixture
def toy_evaluation():
    _register()
    yield
    for registry in (MEASUREMENTS, EVALUATIONS):
        registry._entries.pop("token_count")


def _recipe(**evaluations: Any) -> dict[str, Any]:
    return {"name": "toy", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"], "device": "cpu",
            "isolation": "none", "workload": WORKLOAD, "evaluations": evaluations}


def test_the_built_in_evaluations_are_registered_and_an_unknown_one_is_named() -> None:
    assert {"perplexity", "divergence", "lm_eval_tasks"} <= set(EVALUATIONS.names())
    with pytest.raises(RecipeError, match="evaluations.perplexty: unknown field 'perplexty'; did you mean 'perplexity'"):
        validate_recipe(_recipe(perplexty={}))
    with pytest.raises(RecipeError, match="evaluations.divergence.top_k"):
        validate_recipe(_recipe(perplexity={}, divergence={"top_k": 0}))
    with pytest.raises(RecipeError, match="divergence reads the perplexity evaluation's text"):
        validate_recipe(_recipe(divergence={}))


def test_a_new_evaluation_is_validated_refused_and_measured_through_the_registry(toy_evaluation, tmp_path: Path) -> None:
    from quantlab import run_recipe
    from quantlab.report import load_rows
    from quantlab.run.runner import check_against_model

    with pytest.raises(RecipeError, match="evaluations.token_count.cap_tokens"):
        validate_recipe(_recipe(perplexity={"max_tokens": 512}, token_count={"cap_tokens": 0}))
    with pytest.raises(RecipeError, match="evaluations.token_count: counts with the tokenizer quantlab holds"):
        validate_recipe({**_recipe(perplexity={"max_tokens": 512}, token_count={}),
                         "workload": {**WORKLOAD, "engine": ["eager", "llama.cpp"]}})
    with pytest.raises(RecipeError, match="evaluations.token_count.cap_tokens: a cap of 13 is unlucky"):
        check_against_model(validate_recipe(_recipe(perplexity={"max_tokens": 512}, token_count={"cap_tokens": 13})))
    recipe = validate_recipe(_recipe(perplexity={"max_tokens": 512}, token_count={"cap_tokens": 300}))
    assert recipe.to_spec()["evaluations"]["token_count"] == {"cap_tokens": 300}
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows, _ = load_rows(out)
    assert rows[0]["text_tokens"] == 300 and "| text tokens |" in (out / "report.md").read_text()
    without = validate_recipe(_recipe(perplexity={"max_tokens": 512}))
    assert without.evaluations.token_count is None and without.variants()[0].key != recipe.variants()[0].key
