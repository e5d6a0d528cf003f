"""Divergence figures against a direct computation on two small models."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from quantlab import quantize_
from quantlab.extend import WEIGHT_FORMATS
from quantlab.fidelity.divergence import compare, reference
from tests.conftest import make_llama

CPU = torch.device("cpu")
WINDOW = 32


def _pair():
    base = make_llama()
    variant = copy.deepcopy(base)
    quantize_(variant, WEIGHT_FORMATS["int4"].build(group_size=32))
    ids = torch.randint(0, 4096, (WINDOW * 6 + 5,), generator=torch.Generator().manual_seed(1))
    return base, variant, ids


def _direct(base, variant, ids):
    windows = ids[: ids.numel() // WINDOW * WINDOW].reshape(-1, WINDOW)
    with torch.no_grad():
        logp = F.log_softmax(base(windows).logits[:, :-1].double(), -1)  # float64: the exact figures
        logq = F.log_softmax(variant(windows).logits[:, :-1].double(), -1)
    kl = (logp.exp() * (logp - logq)).sum(-1).reshape(-1)
    nxt = windows[:, 1:].unsqueeze(-1)
    tp, tq = logp.gather(-1, nxt).squeeze(-1), logq.gather(-1, nxt).squeeze(-1)
    return {"kl": kl, "agree": 100 * (logp.argmax(-1) == logq.argmax(-1)).double().mean().item(),
            "dp": (tq.exp() - tp.exp()).reshape(-1), "nll_q": -tq.reshape(-1), "nll_p": -tp.reshape(-1),
            "top_p": logp.exp().max(-1).values.reshape(-1),
            "rms": (tq.exp() - tp.exp()).double().pow(2).mean().sqrt().item(),
            "ppl_p": math.exp(-tp.double().mean().item()), "ppl_q": math.exp(-tq.double().mean().item()),
            "window_diff": (-tq.double().mean(1)) - (-tp.double().mean(1))}


def test_kl_agreement_and_delta_perplexity_equal_a_direct_computation() -> None:
    base, variant, ids = _pair()
    direct = _direct(base, variant, ids)
    ref = reference(base, ids, WINDOW, 4, CPU, top_k=4096)  # every token kept, as float32
    got = compare(variant, ids, ref, 4, CPU)
    assert got["scored_tokens"] == 6 * (WINDOW - 1) and got["windows"] == 6
    # float32 log-probabilities against float64 ones: within 1e-7 nats (the float32 normalizer's rounding)
    assert got["kl_divergence_mean"] == pytest.approx(direct["kl"].double().mean().item(), rel=1e-4, abs=1e-7)
    assert got["kl_divergence_max"] == pytest.approx(direct["kl"].max().item(), rel=1e-4, abs=5e-7)  # one position
    assert got["kl_divergence_median"] == pytest.approx(direct["kl"].double().median().item(), rel=1e-2)
    assert got["kl_divergence_median"] <= got["kl_divergence_p90"] <= got["kl_divergence_p99"] <= got["kl_divergence_max"]
    assert got["top1_agreement_percent"] == pytest.approx(direct["agree"])
    assert got["next_token_prob_rms_diff"] == pytest.approx(direct["rms"], rel=1e-5)
    # a difference of two perplexities near 4,000: float32 log-probabilities hold each to about 1e-7 of itself
    assert got["delta_perplexity"] == pytest.approx(direct["ppl_q"] - direct["ppl_p"], abs=1e-7 * direct["ppl_p"])
    se = direct["window_diff"].std().item() / math.sqrt(6)
    mean = direct["window_diff"].mean().item()
    assert got["delta_perplexity_ci95_low"] == pytest.approx(direct["ppl_p"] * (math.exp(mean - 1.96 * se) - 1),
                                                     abs=1e-7 * direct["ppl_p"])
    assert got["delta_perplexity_ci95_low"] < got["delta_perplexity"] < got["delta_perplexity_ci95_high"]
    # llama-perplexity's figures over the same positions
    n = direct["kl"].numel()
    assert got["kl_divergence_mean_uncertainty"] == pytest.approx(direct["kl"].double().std().item() / math.sqrt(n), rel=1e-3)
    assert got["same_top_p_percent"] == pytest.approx(direct["agree"])
    assert got["delta_p_mean_percent"] == pytest.approx(100 * direct["dp"].double().mean().item(), rel=1e-4, abs=1e-9)
    assert got["delta_p_rms_percent"] == pytest.approx(100 * direct["rms"], rel=1e-5)
    ratio = (direct["nll_q"].double().mean() - direct["nll_p"].double().mean()).item()
    assert got["ln_ppl_ratio_mean"] == pytest.approx(ratio, rel=1e-4)
    corr = torch.corrcoef(torch.stack([direct["nll_q"].double(), direct["nll_p"].double()]))[0, 1].item()
    assert got["ln_ppl_correlation_percent"] == pytest.approx(100 * corr, rel=1e-3)
    q = got["kl_divergence_quantiles"]
    assert q["min"] <= q["0.1"] <= q["1.0"] <= q["median"] <= q["99.0"] <= q["99.9"] <= q["max"] == got["kl_divergence_max"]
    splits = got["confidence_splits"]
    assert sum(s["positions"] for s in splits.values()) == n
    for name, keep in (("<0.5", direct["top_p"] < 0.5), ("0.5-0.9", (direct["top_p"] >= 0.5) & (direct["top_p"] < 0.9)),
                       (">=0.9", direct["top_p"] >= 0.9)):
        assert splits[name]["positions"] == int(keep.sum())
        if keep.any():
            assert splits[name]["kl_mean"] == pytest.approx(direct["kl"][keep].double().mean().item(), rel=1e-4,
                                                                abs=1e-7)


def test_the_default_is_exact_against_float64_and_top_k_is_a_lower_bound() -> None:
    base, variant, ids = _pair()
    windows = ids[: ids.numel() // WINDOW * WINDOW].reshape(-1, WINDOW)
    with torch.no_grad():  # the whole vocabulary in float64
        logp = F.log_softmax(base(windows).logits[:, :-1].double(), -1)
        logq = F.log_softmax(variant(windows).logits[:, :-1].double(), -1)
    exact = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    top = compare(variant, ids, reference(base, ids, WINDOW, 4, CPU, top_k=16), 4, CPU)["kl_divergence_mean"]
    whole = compare(variant, ids, reference(base, ids, WINDOW, 4, CPU, top_k=None), 4, CPU)["kl_divergence_mean"]
    assert whole == pytest.approx(exact, rel=1e-3)  # the bar is 1%
    assert top <= exact * (1 + 1e-6)


def test_the_baseline_against_itself_is_zero_and_fully_agrees() -> None:
    base, _, ids = _pair()
    got = compare(base, ids, reference(base, ids, WINDOW, 4, CPU, top_k=64), 4, CPU)
    assert got["kl_divergence_mean"] == got["kl_divergence_max"] == 0
    assert got["top1_agreement_percent"] == 100 and got["delta_perplexity"] == 0
    assert got["next_token_prob_rms_diff"] == 0


@pytest.mark.parametrize("top_k", [64, None])
def test_a_baseline_against_itself_fully_agrees_where_tokens_tie_for_first(top_k) -> None:
    """Tokens with equal logits (common in bf16) tie for first: whichever one the baseline kept, it agrees."""
    base, _, ids = _pair()
    with torch.no_grad():
        head = base.get_output_embeddings().weight
        head[1::2] = head[0::2]  # every token has a twin with the same logit
    with torch.no_grad():
        logits = base(ids[:WINDOW].unsqueeze(0)).logits[0].float()
    top2 = logits.topk(2, dim=-1)
    assert (top2.values[:, 0] == top2.values[:, 1]).all()  # a tie for first everywhere
    got = compare(base, ids, reference(base, ids, WINDOW, 4, CPU, top_k=top_k), 4, CPU)
    assert got["top1_agreement_percent"] == 100
    assert got["kl_divergence_mean"] == 0


def test_every_storage_mode_counts_top1_agreement_by_one_tie_rule() -> None:
    """With ties for first in both models, the kept top k and the whole vocabulary agree exactly, and agreement is
    the overlap of the two sets of tokens tied for first."""
    base, _, ids = _pair()
    with torch.no_grad():
        head = base.get_output_embeddings().weight
        head[1::2] = head[0::2]
    variant = copy.deepcopy(base)
    quantize_(variant, WEIGHT_FORMATS["int4"].build(group_size=32))
    figures = [compare(variant, ids, reference(base, ids, WINDOW, 4, CPU, top_k=k), 4, CPU)["top1_agreement_percent"]
               for k in (8, 64, None)]
    assert figures[0] == figures[1] == figures[2]
    windows = ids[: ids.numel() // WINDOW * WINDOW].reshape(-1, WINDOW)
    with torch.no_grad():
        lp = F.log_softmax(base(windows).logits[:, :-1].float(), -1).reshape(-1, 4096)
        lq = F.log_softmax(variant(windows).logits[:, :-1].float(), -1).reshape(-1, 4096)
    overlap = ((lp == lp.max(-1, keepdim=True).values) & (lq == lq.max(-1, keepdim=True).values)).any(-1)
    assert figures[2] == pytest.approx(100 * overlap.double().mean().item())


def test_the_noise_floor_is_the_baseline_in_bfloat16_small_but_not_zero_and_below_int4() -> None:
    from quantlab.fidelity.divergence import noise_floor

    base, variant, ids = _pair()
    ref = reference(base, ids, WINDOW, 4, CPU, top_k=None)
    floor = noise_floor(base, ids, ref, 4, CPU)
    assert floor["path"] == "the baseline computed in bfloat16 against itself in float32"
    int4 = compare(variant, ids, ref, 4, CPU)["kl_divergence_mean"]
    assert 0 < floor["kl_mean"] < int4 and floor["kl_mean_uncertainty"] > 0
    assert next(base.parameters()).dtype == torch.float32  # the copy was cast, not the model
