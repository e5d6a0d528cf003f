"""llama.cpp's divergence statistics, computed as its perplexity tool computes them (``llama-perplexity
--kl-divergence``, ``tools/perplexity/perplexity.cpp``: ``kl_divergence`` and its ``mean_and_uncertainty``,
``covariance`` and ``percentile`` lambdas), over per-position values quantlab has in full:

- a mean with its uncertainty: ``f = Σx/n``, ``σ = sqrt((Σx²/n − f²)/(n − 1))`` (0 for n ≤ 10 or a negative
  variance): the standard error of the mean;
- percentiles of the sorted float32 values by linear interpolation at ``fraction · (n − 1)`` (float32 arithmetic),
  the median as the middle value or the mean of the two middle ones;
- KL: mean ± σ, maximum, 99.9/99/95/90 %, median, 10/5/1/0.1 %, minimum;
- Δp = p_variant(next token) − p_baseline(next token): mean ± σ, maximum, 99.9/99/95/90/75 %, median,
  25/10/5/1/0.1 %, minimum, and RMS Δp = sqrt(mean Δp²) with σ = σ(Δp²) / (2 · RMS);
- same top p: the share of positions whose most likely token (the first maximum) is the same, ± sqrt(p(1 − p)/(n − 1));
- ln(PPL(Q)/PPL(base)) = mean NLL − mean baseline NLL per token, ± sqrt(σ² + σ_base² − 2 cov) with
  ``cov = (Σ nll·nll_base/n − mean·mean_base)/(n − 1)``, and the correlation of the two ``cov / (σ σ_base)``.

Where llama-perplexity scores the second half of each chunk of its context, quantlab scores every position of its
windows after the first; the estimators are the same.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

KL_FRACTIONS = {"99.9": 0.999, "99.0": 0.990, "95.0": 0.950, "90.0": 0.900, "10.0": 0.100, "5.0": 0.050,
                "1.0": 0.010, "0.1": 0.001}
DELTA_P_FRACTIONS = {"99.9": 0.999, "99.0": 0.990, "95.0": 0.950, "90.0": 0.900, "75.0": 0.750, "25.0": 0.250,
                     "10.0": 0.100, "5.0": 0.050, "1.0": 0.010, "0.1": 0.001}
CONFIDENCE_EDGES = (0.5, 0.9)  # the baseline's probability of its own top token: < 0.5, 0.5-0.9, >= 0.9


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """llama.cpp's ``mean_and_uncertainty(sum, sum2, count)``."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0


def covariance(total_a: float, total_b: float, total_ab: float, count: int) -> float:
    """llama.cpp's ``covariance(suma, sumb, sumab, count)``: of the two means."""
    if count < 10:
        return 0.0
    return (total_ab / count - (total_a / count) * (total_b / count)) / (count - 1)


def percentile(ordered: np.ndarray, fraction: float) -> float:
    """llama.cpp's ``percentile``: float32 ``values`` sorted ascending, linear interpolation at ``fraction·(n−1)``."""
    if fraction <= 0:
        return float(ordered[0])
    if fraction >= 1:
        return float(ordered[-1])
    p = np.float32(fraction) * np.float32(ordered.size - 1)
    ip = int(p)
    p = np.float32(p - np.float32(ip))
    upper = ordered[min(ip + 1, ordered.size - 1)]
    return float(np.float32(1 - p) * ordered[ip] + p * upper)


def median(ordered: np.ndarray) -> float:
    n = ordered.size
    return float(np.float32(0.5) * (ordered[n // 2] + ordered[n // 2 - 1])) if n % 2 == 0 else float(ordered[n // 2])


def _quantiles(values: torch.Tensor, fractions: dict[str, float]) -> dict[str, float]:
    ordered = np.sort(values.float().numpy())
    found = {"max": float(ordered[-1]), **{k: percentile(ordered, f) for k, f in fractions.items() if f > 0.5}}
    found["median"] = median(ordered)
    found.update({k: percentile(ordered, f) for k, f in fractions.items() if f < 0.5})
    found["min"] = float(ordered[0])
    return found


def _sums(x: torch.Tensor, float32_squares: bool = False) -> tuple[float, float]:
    square = x.float().square().double() if float32_squares else x.double().square()
    return x.double().sum().item(), square.sum().item()


def root(variance: float, float32_products: bool = False) -> float:
    """The square root of a variance estimate; a negative one is 0, or NaN as the tool leaves it
    (``float32_products``)."""
    return math.sqrt(variance) if variance >= 0 else (math.nan if float32_products else 0.0)


def ln_perplexities(nll: torch.Tensor, nll_base: torch.Tensor,
                    float32_products: bool = False) -> tuple[float, float, float, float, float]:
    """ln PPL of the variant and of the baseline with their uncertainties, and their covariance: the mean NLLs
    with ``mean_and_uncertainty`` and ``covariance`` (products in float32 where ``float32_products``)."""
    n = nll.numel()
    log_q, unc_q = mean_and_uncertainty(*_sums(nll, float32_products), n)
    log_b, unc_b = mean_and_uncertainty(*_sums(nll_base, float32_products), n)
    product = nll.float() * nll_base.float() if float32_products else nll.double() * nll_base.double()
    cov = covariance(nll.double().sum().item(), nll_base.double().sum().item(), product.double().sum().item(), n)
    return log_q, unc_q, log_b, unc_b, cov


def llama_statistics(kl: torch.Tensor, nll: torch.Tensor, nll_base: torch.Tensor, delta_p: torch.Tensor,
                     same_top: torch.Tensor, float32_products: bool = False) -> dict[str, Any]:
    """The figures llama-perplexity prints, from per-position KL, the variant's and the baseline's negative
    log-likelihood of the next token, Δp and whether the first most likely tokens are the same.

    ``float32_products``: square the NLLs and Δp and multiply NLL by baseline NLL in float32 before summing in
    float64, and leave the square root of a negative variance NaN, as the tool does (its ``nll*nll``,
    ``nll*nll_base`` and ``p_diff*p_diff`` are float products); its printed uncertainties are then reproduced to
    the last digit. The default keeps every product in float64."""
    n = kl.numel()
    f32 = float32_products
    kl_mean, kl_unc = mean_and_uncertainty(*_sums(kl), n)
    log_ppl, log_ppl_unc, log_base, log_base_unc, cov = ln_perplexities(nll, nll_base, f32)
    ratio_unc = root(log_ppl_unc ** 2 + log_base_unc ** 2 - 2 * cov, f32)
    dp_mean, dp_unc = mean_and_uncertainty(*_sums(delta_p), n)
    dp2 = delta_p.float().square().double() if f32 else delta_p.double().square()
    mse, mse_unc = mean_and_uncertainty(dp2.sum().item(), dp2.pow(2).sum().item(), n)
    rms = math.sqrt(mse)
    same = same_top.double().mean().item()
    return {
        "kl_divergence_mean": kl_mean, "kl_divergence_mean_uncertainty": kl_unc,
        "kl_divergence_quantiles": _quantiles(kl, KL_FRACTIONS),
        "delta_p_mean_percent": 100 * dp_mean, "delta_p_mean_uncertainty_percent": 100 * dp_unc,
        "delta_p_rms_percent": 100 * rms, "delta_p_rms_uncertainty_percent": 100 * (0.5 / rms * mse_unc if rms else 0.0),
        "delta_p_quantiles_percent": {k: 100 * v for k, v in _quantiles(delta_p, DELTA_P_FRACTIONS).items()},
        "same_top_p_percent": 100 * same,
        "same_top_p_uncertainty_percent": 100 * math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0,
        "ln_ppl_ratio_mean": log_ppl - log_base, "ln_ppl_ratio_uncertainty": ratio_unc,
        "ln_ppl_correlation_percent": 100 * cov / (log_ppl_unc * log_base_unc) if log_ppl_unc * log_base_unc else 0.0,
    }


def split_bounds(edges: tuple[float, ...] = CONFIDENCE_EDGES) -> dict[str, tuple[float, float]]:
    """Each confidence split's name (``<0.5``, ``0.5-0.9``, ``>=0.9``) and its ``[low, high)`` bounds."""
    bounds = [0.0, *edges, math.inf]
    return {(f"<{high:g}" if low == 0 else f">={low:g}" if high == math.inf else f"{low:g}-{high:g}"): (low, high)
            for low, high in zip(bounds, bounds[1:])}


def confidence_splits(kl: torch.Tensor, delta_p: torch.Tensor, base_top_prob: torch.Tensor,
                      edges: tuple[float, ...] = CONFIDENCE_EDGES) -> dict[str, dict[str, float]]:
    """KL and Δp split by the baseline's probability of its own most likely token (``< 0.5``, ``0.5-0.9``,
    ``>= 0.9`` by default): per split its share of positions, KL mean ± σ, median, p99 and max, Δp mean and RMS."""
    splits: dict[str, dict[str, float]] = {}
    for name, (low, high) in split_bounds(edges).items():
        keep = (base_top_prob >= low) & (base_top_prob < high)
        count = int(keep.sum())
        if count == 0:
            splits[name] = {"positions": 0, "share_percent": 0.0}
            continue
        k, d = kl[keep], delta_p[keep]
        mean, unc = mean_and_uncertainty(*_sums(k), count)
        ordered = np.sort(k.float().numpy())
        splits[name] = {"positions": count, "share_percent": 100 * count / kl.numel(), "kl_mean": mean,
                        "kl_mean_uncertainty": unc, "kl_median": median(ordered),
                        "kl_p99": percentile(ordered, 0.99), "kl_max": float(ordered[-1]),
                        "delta_p_mean_percent": 100 * d.double().mean().item(),
                        "delta_p_rms_percent": 100 * d.double().pow(2).mean().sqrt().item()}
    return splits
