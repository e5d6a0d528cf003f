"""Log-probabilities normalized by an accurately summed logsumexp, against float64 over a real vocabulary's size."""
import torch

from quantlab.fidelity.log_probs import log_probs, nll_sum

VOCAB = 49_152  # SmolLM2's


def _logits(rows: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, VOCAB, generator=g) * 3 + 20  # spread and offset of a real model's logits


def test_log_probs_are_float64_s_within_float32_rounding_without_a_bias() -> None:
    logits = _logits()
    exact = torch.log_softmax(logits.double(), -1)
    err = log_probs(logits).double() - exact
    assert log_probs(logits).dtype == torch.float32
    assert err.mean().abs() < 2e-7 and err.abs().max() < 1e-5  # float32 ulp near |log p| ~ 15 is 1e-6
    assert (log_probs(logits).exp().double().sum(-1) - 1).abs().max() < 1e-5


def test_nll_sum_is_the_float64_negative_log_likelihood() -> None:
    logits = _logits()
    targets = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(1))
    exact = -torch.log_softmax(logits.double(), -1).gather(-1, targets[:, None]).sum().item()
    assert abs(nll_sum(logits, targets) - exact) < 64 * 2e-6
    assert abs(nll_sum(logits[None], targets[None]) - exact) < 64 * 2e-6  # any leading shape
