"""Greedy generation agreement: the decode loop through a cache is transformers' own greedy generation, its
teacher-forced distributions are a cacheless forward's, the agreement figures equal a direct count, and in a run the
baseline agrees with itself while a 2-bit KV cache's continuations part from it."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from quantlab import run_recipe, validate_recipe
from quantlab.eval.generation import agreement, decode, prompt_windows
from quantlab.extend import KV_FORMATS
from quantlab.files import read_jsonl
from tests.conftest import make_llama

CPU = torch.device("cpu")


def test_greedy_decoding_through_the_cache_is_transformers_greedy_generation() -> None:
    model = make_llama().eval()
    prompts = torch.randint(0, 4096, (3, 12), generator=torch.Generator().manual_seed(0))
    tokens, logprobs = decode(model, prompts, KV_FORMATS["native"].build(), 10, CPU)
    with torch.no_grad():
        theirs = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=10, do_sample=False,
                                min_new_tokens=10, pad_token_id=0)[:, 12:]
    assert torch.equal(tokens, theirs)
    forced_tokens, forced = decode(model, prompts, KV_FORMATS["native"].build(), 10, CPU, follow=theirs)
    assert torch.equal(forced_tokens, theirs)
    with torch.no_grad():  # the distributions before each generated token, from one cacheless forward
        full = F.log_softmax(model(torch.cat([prompts, theirs], 1)).logits[:, 11:21].float(), -1)
    assert torch.allclose(forced, full, atol=1e-4) and torch.allclose(logprobs, full, atol=1e-4)


def test_agreement_counts_tokens_to_the_first_difference_and_identical_continuations() -> None:
    base = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    variant = torch.tensor([[1, 2, 0, 4], [5, 6, 7, 8], [0, 9, 9, 9]])
    logp = F.log_softmax(torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(1)), -1)
    logq = F.log_softmax(logp + 0.1 * torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(2)), -1)
    got = agreement(base, variant, logp, logq)
    assert got["generation_tokens_to_first_difference_mean"] == pytest.approx((2 + 4 + 0) / 3)
    assert got["generation_identical_percent"] == pytest.approx(100 / 3)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    assert got["generation_kl_mean"] == pytest.approx(kl.double().mean().item(), rel=1e-6)
    assert got["generation_kl_max"] == pytest.approx(kl.max().item(), rel=1e-6)
    assert agreement(base, base, logp, logp)["generation_kl_mean"] == 0


def test_prompts_are_evenly_spaced_windows_of_the_text() -> None:
    ids = torch.arange(100)
    windows = prompt_windows(ids, 3, 10)
    assert windows[:, 0].tolist() == [0, 45, 90] and windows.shape == (3, 10)
    with pytest.raises(ValueError, match="fewer than one prompt of 200"):
        prompt_windows(ids, 2, 200)


@pytest.mark.slow  # a run of two variants; CI's slow tier runs it
def test_in_a_run_the_baseline_agrees_with_itself_and_a_two_bit_cache_parts_from_it(tmp_path: Path) -> None:
    recipe = {"name": "gen", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
              "kv_cache": ["native", {"format": "int2", "group_size": 32, "residual_tokens": 0}],
              "workload": {"batch_size": 1, "prompt_tokens": 48, "new_tokens": 2, "warmup_runs": 0,
                           "prefill_repeats": 1, "engine": "eager"},
              "evaluations": {"perplexity": {"window_tokens": 128, "max_tokens": 2048},
                              "generation": {"prompts": 3, "new_tokens": 24}},
              "isolation": "none", "device": "cpu"}
    out = run_recipe(validate_recipe(recipe), tmp_path / "out", log=lambda _: None)
    rows = {r["kv_format"]: r for r in read_jsonl(out / "results.jsonl")}
    base, int2 = rows["native"], next(r for k, r in rows.items() if k != "native")
    assert base["generation_identical_percent"] == 100 and base["generation_kl_mean"] == 0
    assert base["generation_tokens_to_first_difference_mean"] == 24
    assert int2["generation_kl_mean"] > 0 and int2["generation_tokens_to_first_difference_mean"] < 24
    assert int2["generation_protocol"]["prompt_tokens"] == 48 and int2["generation_protocol"]["kv_format"] != "native"
    assert len(list((out / "baselines").glob("generation-*.pt"))) == 1
    assert "Greedy generation against the baseline" in (out / "report.md").read_text()
