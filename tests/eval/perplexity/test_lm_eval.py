"""quantlab's perplexity protocols against lm-evaluation-harness where their windows coincide."""
import math

import pytest
import torch

pytest.importorskip("lm_eval")

from quantlab.data import load_text  # noqa: E402
from quantlab.eval.lm_eval import rolling_token_loglikelihood  # noqa: E402
from quantlab.eval.perplexity import perplexity  # noqa: E402
from quantlab.eval.perplexity.lm_eval import lm_eval_perplexity  # noqa: E402
from quantlab.eval.tokens import tokenize  # noqa: E402
from quantlab.models import load_model  # noqa: E402
from quantlab.run.recipe import ModelSpec  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bundled():
    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"))
    text = load_text("bundled-heldout")
    short = type(text)("bundled-heldout[:6000 chars]", text.text[:6000])
    return loaded.model, loaded.tokenizer, short


def test_sliding_protocol_with_a_prefix_token_is_lm_evals_rolling_loglikelihood(bundled) -> None:
    model, tokenizer, text = bundled
    window = 128
    # lm-eval stretches a short last window back to full length; cut the text at a window boundary so
    # every window coincides.
    ids = tokenize(tokenizer, text)[: 10 * window]
    text = type(text)(text.source + "[:10 windows]", tokenizer.decode(ids))
    assert torch.equal(tokenize(tokenizer, text), ids) and ids.numel() == 10 * window
    loglik, tokens = rolling_token_loglikelihood(model, tokenizer, [text.text], window_tokens=window, batch_size=4, device=CPU)
    # lm-eval: disjoint windows of `window` scored tokens, each after one token of context, an EOT first.
    ids = torch.cat([torch.tensor([tokenizer.eos_token_id]), ids])
    ours = perplexity(model, ids, text, protocol="sliding", window_tokens=window + 1, stride_tokens=window,
                      batch_size=4, device=CPU)
    assert ours["perplexity_protocol"]["scored_tokens"] == tokens
    assert ours["perplexity"] == pytest.approx(math.exp(-loglik / tokens), rel=1e-4)


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_lm_eval_protocol_reports_the_harness_metrics(bundled) -> None:
    model, tokenizer, text = bundled
    got = lm_eval_perplexity(model, tokenizer, text, window_tokens=128, batch_size=4, device=CPU)
    n_words, n_bytes = len(text.text.split()), len(text.text.encode())
    loglik = math.log(got["lm_eval_token_perplexity"]) * got["perplexity_protocol"]["scored_tokens"]
    assert got["lm_eval_word_perplexity"] == pytest.approx(math.exp(loglik / n_words), rel=1e-3)
    assert got["lm_eval_bits_per_byte"] == pytest.approx(loglik / n_bytes / math.log(2), rel=1e-3)
    assert got["perplexity"] == pytest.approx(got["lm_eval_word_perplexity"], rel=1e-4)
    assert got["perplexity_protocol"]["name"] == "lm-eval"


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_recipe_can_name_the_lm_eval_protocol(small_model_dir, tmp_path) -> None:
    from quantlab import run_recipe, validate_recipe
    from quantlab.files import read_jsonl

    recipe = validate_recipe({
        "name": "lm-eval", "model": {"path": str(small_model_dir)}, "weights": ["fp32"], "isolation": "none",
        "workload": {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
        "evaluations": {"perplexity": {"protocol": "lm-eval", "window_tokens": 64, "max_tokens": 512}},
    })
    row = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")[0]
    assert row["status"] == "ok", row.get("error")
    assert row["perplexity_protocol"]["name"] == "lm-eval" and row["perplexity_protocol"]["scored_tokens"] == 512
    assert row["perplexity"] == pytest.approx(row["lm_eval_word_perplexity"], rel=1e-4)
    assert "lm-eval" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow  # end to end through lm-eval; CI's slow tier runs it
def test_a_local_lm_eval_task_runs_and_lands_in_the_results(tmp_path) -> None:
    from pathlib import Path

    from quantlab import run_recipe, validate_recipe
    from quantlab.files import read_jsonl

    evals = Path(__file__).resolve().parents[3] / "evals" / "stdlib_continuation"
    recipe = validate_recipe({
        "name": "tasks", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"], "isolation": "none",
        "workload": {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
        "evaluations": {"lm_eval_tasks": [{"task": "stdlib_continuation", "include_path": str(evals), "limit": 40}]},
    })
    row = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")[0]
    assert row["status"] == "ok", row.get("error")
    assert row["lm_eval_tasks"][0]["task"] == "stdlib_continuation"
    assert 0.4 < row["lm_eval_stdlib_continuation_acc"] <= 1.0  # chance is 0.25
