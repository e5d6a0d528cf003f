import math

import pytest

from quantlab.report.pareto import pareto_front


def test_front_of_a_hand_made_set() -> None:
    # (bytes, perplexity): a dominates b; c is cheaper but worse; d is worse on both than a; e ties a's cost, worse.
    costs = [10.0, 12.0, 4.0, 11.0, 10.0, 2.0]
    losses = [5.0, 5.5, 7.0, 6.0, 5.2, 9.0]
    assert pareto_front(costs, losses) == [True, False, True, False, False, True]


def test_duplicates_are_both_on_the_front_and_nan_never_is() -> None:
    assert pareto_front([1.0, 1.0, 2.0], [3.0, 3.0, 1.0]) == [True, True, True]
    assert pareto_front([1.0, math.nan, 0.5], [1.0, 0.1, math.nan]) == [True, False, False]


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError):
        pareto_front([1.0], [1.0, 2.0])
