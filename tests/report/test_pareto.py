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


def test_labels_of_nearby_points_are_placed_apart() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quantlab.report.plots import place_labels

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    points = [(5.0, 20.0, "nf4-b64"), (5.0, 20.1, "hqq4-g64"), (5.01, 20.05, "int4-g64-asym"),
              (9.0, 19.0, "int8-pc-asym/kv-native"), (9.0, 19.0 + 1e-3, "int8-pc-asym/kv-int4")]
    ax.scatter([p[0] for p in points], [p[1] for p in points])
    boxes = place_labels(ax, points)
    assert len(boxes) == len(points)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 for b in boxes)  # none runs off the figure
    plt.close(fig)
