"""The paired bootstrap: its interval covers the direct difference, a shift that is the same in every window is
found however noisy the windows are, and two variants that differ only by noise are not told apart."""
import math

import numpy as np
import pytest

from quantlab.fidelity.paired import paired_bootstrap

RNG = np.random.default_rng(0)


def test_a_small_constant_shift_under_large_window_noise_is_distinguishable_because_the_windows_are_paired() -> None:
    hard = RNG.exponential(1.0, 40)  # what the windows share: most of the variation
    a, b = hard + 0.01, hard
    got = paired_bootstrap(a, b)
    assert got["difference"] == pytest.approx(0.01)
    assert got["low"] == pytest.approx(0.01) and got["high"] == pytest.approx(0.01)  # the pairs all differ by 0.01
    assert got["distinguishable"] and got["windows"] == 40
    unpaired = paired_bootstrap(a, RNG.permutation(b))  # the pairs broken: the same shift is lost in the noise
    assert unpaired["difference"] == pytest.approx(0.01) and not unpaired["distinguishable"]


def test_noise_alone_is_not_distinguishable_and_the_interval_holds_the_difference() -> None:
    base = RNG.exponential(1.0, 64)
    a, b = base + RNG.normal(0, 0.05, 64), base + RNG.normal(0, 0.05, 64)
    got = paired_bootstrap(a, b)
    assert got["low"] <= got["difference"] <= got["high"]
    assert got["low"] < 0 < got["high"] and not got["distinguishable"]
    se = np.std(a - b, ddof=1) / math.sqrt(64)
    assert got["high"] - got["low"] == pytest.approx(2 * 1.96 * se, rel=0.2)  # the normal interval, roughly


def test_perplexity_differences_are_of_exp_of_the_mean_nll() -> None:
    nll_a, nll_b = np.full(10, 2.0) + RNG.normal(0, 0.01, 10), np.full(10, 2.1) + RNG.normal(0, 0.01, 10)
    got = paired_bootstrap(nll_a, nll_b, perplexity=True)
    assert got["difference"] == pytest.approx(math.exp(nll_a.mean()) - math.exp(nll_b.mean()))
    assert got["distinguishable"] and got["high"] < 0
    with pytest.raises(ValueError, match="same windows"):
        paired_bootstrap([1.0, 2.0], [1.0, 2.0, 3.0])
