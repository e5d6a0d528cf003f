"""How far a variant's next-token distributions are from the baseline's, on the same token windows.

The baseline's distributions are computed once (``reference``) and kept whole: every position's log-probabilities
over the whole vocabulary in float32, the dtype the variant's are computed in (``top_k = None``, the default: exact,
4 bytes per vocabulary entry per scored position). ``top_k = k`` keeps only the k largest with their token ids and
the log of the mass outside them, an approximation that is opt-in. A variant is then scored against them
(``compare``), per position:

- KL(baseline ‖ variant) = Σ p (log p − log q). With top-k the tokens outside the baseline's k are merged into
  one outcome (p_rest, q_rest): by the log-sum inequality this is never above the full-vocabulary KL (a lower
  bound), and the gap is p_rest times the KL between the two renormalized tails (the mean p_rest is reported
  beside it);
- top-1 agreement, under one rule in every mode: a position agrees when some token is most likely under both
  distributions (the sets of tokens tied for first overlap; bf16 logits tie often);
- the difference in the probability of the token that actually comes next (its RMS over positions);
- and per window the mean negative log-likelihood, from which Δ perplexity and a 95% interval over the paired
  per-window differences follow (windows of equal length: perplexity = exp of the mean of window means).

Over the per-position values the figures llama.cpp's perplexity tool prints follow, with its estimators
(``statistics.llama_statistics``: KL and Δp means with their uncertainty and percentiles, RMS Δp, same top p,
ln(PPL ratio) and its correlation), and the same split by the baseline's confidence in its top token
(``statistics.confidence_splits``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..progress import progress
from .log_probs import log_probs
from .statistics import confidence_splits, llama_statistics


@dataclass
class Reference:
    """The baseline's next-token distributions at every scored position of the windows."""

    top_logprobs: torch.Tensor  # [positions, k] float32, largest first; the whole vocabulary: float32, in id order
    top_ids: torch.Tensor | None  # [positions, k] int32, None when the whole vocabulary is kept
    rest_logmass: torch.Tensor  # [positions] float32: log of the mass outside the k (-inf for the whole vocabulary)
    target_logprobs: torch.Tensor  # [positions] float32: log p(the token that comes next)
    window_nll: torch.Tensor  # [windows] float64: mean negative log-likelihood per window
    window_tokens: int

    def state(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Reference":
        return cls(**state)


def _windows(ids: torch.Tensor, window_tokens: int) -> torch.Tensor:
    """Disjoint windows ``[n, window]`` of the token ids, the tail shorter than a window dropped."""
    n = ids.numel() // window_tokens
    return ids.reshape(-1)[: n * window_tokens].reshape(n, window_tokens)


@torch.no_grad()
def _log_probs(model: nn.Module, ids: torch.Tensor, window_tokens: int, batch_size: int, device: torch.device,
               what: str | None):
    """``(log-probabilities [batch, window - 1, vocab] float32, next tokens [batch, window - 1])`` per batch
    (``what``: the progress bar's name; None shows none)."""
    windows = _windows(ids, window_tokens)
    starts = range(0, windows.shape[0], batch_size)
    for start in (progress(starts, what) if what else starts):
        batch = windows[start:start + batch_size].to(device)
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()
        yield log_probs(logits), batch[:, 1:]


def reference(model: nn.Module, ids: torch.Tensor, window_tokens: int, batch_size: int, device: torch.device,
              top_k: int | None, what: str | None = "divergence reference, windows") -> Reference:
    """The baseline's distributions on the disjoint windows of ``ids``."""
    tops, idx, rest, targets, nll = [], [], [], [], []
    for logp, nxt in _log_probs(model, ids, window_tokens, batch_size, device, what):
        target = logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
        targets.append(target.reshape(-1).cpu())
        nll.append((-target).double().mean(dim=1).cpu())
        flat = logp.reshape(-1, logp.shape[-1])
        if top_k is None:
            tops.append(flat.cpu())
            rest.append(torch.full((flat.shape[0],), -math.inf))
        else:
            values, ids_k = flat.topk(min(top_k, flat.shape[-1]), dim=-1)
            tops.append(values.cpu())
            idx.append(ids_k.int().cpu())
            kept = torch.logsumexp(values, dim=-1)
            rest.append(torch.log1p(-kept.exp().clamp(max=1 - 1e-7)).cpu())
    return Reference(torch.cat(tops), torch.cat(idx) if idx else None, torch.cat(rest), torch.cat(targets),
                     torch.cat(nll), window_tokens)


def top1_agree(logp: torch.Tensor, logq_at: torch.Tensor, logq_max: torch.Tensor) -> torch.Tensor:
    """Per position: whether some token is most likely under both distributions. ``logp`` holds the baseline's
    log-probabilities (the whole vocabulary, or its top k, which hold every token tied for its first), ``logq_at``
    the variant's at the same tokens and ``logq_max`` the variant's largest over the whole vocabulary."""
    base_first = logp == logp.max(-1, keepdim=True).values
    return (base_first & (logq_at == logq_max.unsqueeze(-1))).any(-1)


def compare(model: nn.Module, ids: torch.Tensor, ref: Reference, batch_size: int, device: torch.device,
            what: str | None = "divergence, windows") -> dict[str, Any]:
    """The divergence figures of ``model`` against ``ref`` on the same windows."""
    kls, agree, same, dprob, nll, token_nll, base_top, window_kl = [], [], [], [], [], [], [], []
    offset = 0
    for logq, nxt in _log_probs(model, ids, ref.window_tokens, batch_size, device, what):
        flat = logq.reshape(-1, logq.shape[-1])
        rows = slice(offset, offset + flat.shape[0])
        offset += flat.shape[0]
        logp = ref.top_logprobs[rows].to(flat.device).float()
        if ref.top_ids is None:
            logq_at = flat
            kl = (logp.exp() * (logp - flat)).sum(-1)
            base_first = logp.argmax(-1)
        else:
            top_ids = ref.top_ids[rows].to(flat.device).long()
            logq_at = flat.gather(-1, top_ids)
            rest_p = ref.rest_logmass[rows].to(flat.device)
            rest_q = torch.log1p(-torch.logsumexp(logq_at, dim=-1).exp().clamp(max=1 - 1e-7))
            kl = (logp.exp() * (logp - logq_at)).sum(-1) + rest_p.exp() * (rest_p - rest_q)
            base_first = top_ids[:, 0]
        kls.append(kl.clamp(min=0).cpu())
        window_kl.append(kls[-1].double().reshape(nxt.shape).mean(dim=1))
        agree.append(top1_agree(logp, logq_at, flat.max(-1).values).cpu())
        same.append((flat.argmax(-1) == base_first).cpu())  # llama.cpp's "same top p": the first maxima
        base_top.append(logp.max(-1).values.exp().cpu())
        target = flat.gather(-1, nxt.reshape(-1, 1)).squeeze(-1)
        dprob.append((target.exp() - ref.target_logprobs[rows].to(flat.device).exp()).cpu())
        token_nll.append((-target).cpu())
        nll.append((-target).double().reshape(nxt.shape).mean(dim=1).cpu())
    kl, window_nll, delta_p = torch.cat(kls), torch.cat(nll), torch.cat(dprob)
    diff = window_nll - ref.window_nll
    n = diff.numel()
    mean = diff.mean().item()
    half = 1.96 * diff.std(unbiased=True).item() / math.sqrt(n) if n > 1 else math.nan
    base_ppl = math.exp(ref.window_nll.mean().item())
    stats = llama_statistics(kl, torch.cat(token_nll), -ref.target_logprobs[: kl.numel()], delta_p, torch.cat(same))
    q = stats["kl_divergence_quantiles"]
    return {
        **stats, "kl_divergence_median": q["median"], "kl_divergence_p90": q["90.0"], "kl_divergence_p99": q["99.0"],
        "kl_divergence_p999": q["99.9"], "kl_divergence_max": q["max"],
        "top1_agreement_percent": 100 * torch.cat(agree).double().mean().item(),
        "next_token_prob_rms_diff": delta_p.double().pow(2).mean().sqrt().item(),
        "delta_perplexity": base_ppl * (math.exp(mean) - 1),
        "delta_perplexity_ci95_low": base_ppl * (math.exp(mean - half) - 1),
        "delta_perplexity_ci95_high": base_ppl * (math.exp(mean + half) - 1),
        "confidence_splits": confidence_splits(kl, delta_p, torch.cat(base_top)),
        "divergence_windows": {"kl_mean": torch.cat(window_kl).tolist(), "nll_mean": window_nll.tolist()},
        "baseline_perplexity": base_ppl, "scored_tokens": kl.numel(), "windows": n,
        "baseline_rest_mass_mean": ref.rest_logmass.exp().double().mean().item(),
    }


def noise_floor(model: nn.Module, ids: torch.Tensor, ref: Reference, batch_size: int, device: torch.device,
                what: str | None = "noise floor, windows") -> dict[str, Any]:
    """The baseline against itself through a numerically equivalent path: a copy of ``model`` computing in bfloat16
    (float32 where ``model`` computes in a 16-bit dtype), scored against ``ref`` like any variant. What a variant
    cannot be told from: a divergence at this level is the arithmetic's, not the format's."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    twin = copy.deepcopy(model).to(other)
    figures = compare(twin, ids, ref, batch_size, device, what)
    del twin
    return {"path": f"the baseline computed in {str(other).removeprefix('torch.')} against itself in "
                    f"{str(dtype).removeprefix('torch.')}",
            "kl_mean": figures["kl_divergence_mean"], "kl_mean_uncertainty": figures["kl_divergence_mean_uncertainty"],
            "kl_p99": figures["kl_divergence_p99"], "same_top_p_percent": figures["same_top_p_percent"],
            "delta_p_rms_percent": figures["delta_p_rms_percent"]}
