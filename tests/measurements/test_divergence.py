"""The divergence evaluation in a run: stored baseline, every variant's figures, the report's plot."""
from pathlib import Path

import pytest

from quantlab import RecipeError, run_recipe, validate_recipe
from quantlab.files import read_jsonl


def _recipe(weights: list, **divergence) -> dict:
    return {"name": "div", "model": {"bundled": "tiny-stdlib-llama"}, "weights": weights,
            "workload": {"batch_size": 1, "prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
            "evaluations": {"perplexity": {"window_tokens": 128, "max_tokens": 4096}, "divergence": divergence},
            "isolation": "none", "device": "cpu"}


@pytest.mark.slow  # a run of three variants; CI's slow tier runs it
def test_int2_diverges_more_than_int8_and_the_baseline_not_at_all(tmp_path: Path) -> None:
    out = run_recipe(validate_recipe(_recipe(["fp32", "int8", {"format": "int2", "group_size": 64}])), tmp_path / "out",
                     log=lambda _: None)
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    base, int8, int2 = rows["fp32"], rows["int8-pc-asym"], rows["int2-g64-asym"]
    assert base["kl_divergence_mean"] == 0 and base["top1_agreement_percent"] == 100
    assert 0 < int8["kl_divergence_mean"] < int2["kl_divergence_mean"]
    assert int8["top1_agreement_percent"] > int2["top1_agreement_percent"]
    assert int2["delta_perplexity_ci95_low"] > 0  # int2 is measurably worse
    assert int2["divergence_protocol"]["scored_tokens"] == 32 * 127
    assert int2["divergence_protocol"]["baseline"] == "fp32" and int2["divergence_protocol"]["top_k"] is None
    assert len(list((out / "baselines").glob("*.pt"))) == 1  # computed once, by the baseline
    html = (out / "report.html").read_text()
    assert 'id="plot-divergence"' in html and "KL mean" in html


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_a_variant_measured_before_its_baseline_computes_and_stores_the_reference(tmp_path: Path) -> None:
    recipe = validate_recipe({**_recipe(["int8", "fp32"], top_k=32), "baseline": "fp32"})
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    assert rows["fp32"]["kl_divergence_mean"] == 0 and rows["int8-pc-asym"]["kl_divergence_mean"] > 0
    assert len(list((out / "baselines").glob("*.pt"))) == 1


def test_divergence_needs_the_perplexity_text(tmp_path: Path) -> None:
    spec = _recipe(["fp32", "int8"])
    del spec["evaluations"]["perplexity"]
    with pytest.raises(RecipeError, match="evaluations.*perplexity"):
        validate_recipe(spec)
