"""llama-perplexity's estimators (tools/perplexity/perplexity.cpp) against direct computations: the uncertainty of a
mean is its standard error, percentiles interpolate linearly in float32 at fraction·(n−1), the median is the middle
value or the mean of the middle two, and the ln(PPL) ratio's uncertainty takes the two series' covariance."""
import math

import numpy as np
import pytest
import torch

from quantlab.fidelity.statistics import (
    confidence_splits,
    covariance,
    llama_statistics,
    mean_and_uncertainty,
    median,
    percentile,
)

RNG = np.random.default_rng(0)


def test_the_uncertainty_of_a_mean_is_its_standard_error_and_none_for_ten_values_or_fewer() -> None:
    x = RNG.exponential(0.01, 5000)
    mean, unc = mean_and_uncertainty(x.sum(), (x * x).sum(), x.size)
    assert mean == pytest.approx(x.mean(), rel=1e-12)
    assert unc == pytest.approx(x.std(ddof=1) / math.sqrt(x.size), rel=1e-9)
    assert mean_and_uncertainty(x[:10].sum(), (x[:10] ** 2).sum(), 10)[1] == 0.0
    assert mean_and_uncertainty(0.0, 0.0, 0) == (0.0, 0.0)


def test_percentiles_interpolate_in_float32_as_llama_cpp_does() -> None:
    ordered = np.sort(RNG.standard_normal(1001).astype(np.float32))
    assert percentile(ordered, 0.5) == float(ordered[500]) == median(ordered)  # p = 500 exactly
    p = np.float32(0.999) * np.float32(1000)  # 999.0 in float32
    assert percentile(ordered, 0.999) == float(ordered[int(p)])
    assert percentile(ordered, 0.0) == float(ordered[0]) and percentile(ordered, 1.0) == float(ordered[-1])
    even = np.sort(RNG.standard_normal(1000).astype(np.float32))
    assert median(even) == float(np.float32(0.5) * (even[499] + even[500]))
    assert percentile(even, 0.9) == pytest.approx(np.percentile(even.astype(np.float64), 90), abs=1e-5)


def test_the_ln_ppl_ratio_takes_the_covariance_of_the_two_series() -> None:
    base = torch.from_numpy(RNG.exponential(2.0, 4000))
    variant = base + torch.from_numpy(RNG.normal(0.02, 0.05, 4000))
    n = base.numel()
    kl = torch.from_numpy(RNG.exponential(0.01, n)).float()
    dp = torch.from_numpy(RNG.normal(-0.001, 0.02, n)).float()
    same = torch.from_numpy(RNG.random(n) < 0.93)
    got = llama_statistics(kl, variant, base, dp, same)
    diff = (variant - base).numpy()
    assert got["ln_ppl_ratio_mean"] == pytest.approx(diff.mean(), rel=1e-9)
    assert got["ln_ppl_ratio_uncertainty"] == pytest.approx(diff.std(ddof=1) / math.sqrt(n), rel=1e-6)  # var(a−b)
    assert got["ln_ppl_correlation_percent"] == pytest.approx(100 * np.corrcoef(variant, base)[0, 1], rel=1e-6)
    cov = covariance(variant.sum().item(), base.sum().item(), (variant * base).sum().item(), n)
    assert cov == pytest.approx(np.cov(variant, base, ddof=0)[0, 1] / (n - 1), rel=1e-9)
    p = same.double().mean().item()
    assert got["same_top_p_percent"] == pytest.approx(100 * p)
    assert got["same_top_p_uncertainty_percent"] == pytest.approx(100 * math.sqrt(p * (1 - p) / (n - 1)))
    rms = math.sqrt((dp.double() ** 2).mean().item())
    assert got["delta_p_rms_percent"] == pytest.approx(100 * rms, rel=1e-9)
    dp2 = (dp.double() ** 2).numpy()
    assert got["delta_p_rms_uncertainty_percent"] == pytest.approx(
        100 * 0.5 / rms * dp2.std(ddof=1) / math.sqrt(n), rel=1e-6)
    q = got["delta_p_quantiles_percent"]
    assert list(q) == ["max", "99.9", "99.0", "95.0", "90.0", "75.0", "median", "25.0", "10.0", "5.0", "1.0", "0.1", "min"]
    assert q["max"] == pytest.approx(100 * dp.max().item()) and q["min"] == pytest.approx(100 * dp.min().item())


def test_confidence_splits_partition_the_positions() -> None:
    n = 3000
    top = torch.from_numpy(RNG.random(n)).float()
    kl = torch.from_numpy(RNG.exponential(0.01, n)).float() * (1.5 - top)
    dp = torch.from_numpy(RNG.normal(0, 0.01, n)).float()
    splits = confidence_splits(kl, dp, top)
    assert list(splits) == ["<0.5", "0.5-0.9", ">=0.9"]
    assert sum(s["positions"] for s in splits.values()) == n
    assert sum(s["share_percent"] for s in splits.values()) == pytest.approx(100)
    low = top < 0.5
    assert splits["<0.5"]["kl_mean"] == pytest.approx(kl[low].double().mean().item(), rel=1e-9)
    assert splits["<0.5"]["kl_mean"] > splits[">=0.9"]["kl_mean"]  # less confident positions diverge more here
    assert splits["0.5-0.9"]["delta_p_rms_percent"] == pytest.approx(
        100 * dp[(top >= 0.5) & (top < 0.9)].double().pow(2).mean().sqrt().item(), rel=1e-9)
    empty = confidence_splits(kl[:5], dp[:5], torch.full((5,), 0.95))
    assert empty["<0.5"] == {"positions": 0, "share_percent": 0.0}
