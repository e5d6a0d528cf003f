"""The multiple-choice knapsack against exhaustive search."""
import itertools
import random

import pytest

from quantlab.quant.mixed.knapsack import InfeasibleBudget, choose, choose_greedy


def _brute(costs, sizes, budget):
    best = None
    for options in itertools.product(*(range(len(c)) for c in costs)):
        size = sum(sizes[i][j] for i, j in enumerate(options))
        cost = sum(costs[i][j] for i, j in enumerate(options))
        if size <= budget and (best is None or cost < best[0] - 1e-12):
            best = (cost, size)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_least_cost_within_the_budget_equals_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    items, options = rng.randint(1, 7), rng.randint(1, 4)
    sizes = [[rng.choice([rng.randint(1, 50), 64, 128]) for _ in range(options)] for _ in range(items)]
    costs = [[rng.random() * 10 for _ in range(options)] for _ in range(items)]
    budget = rng.randint(sum(min(s) for s in sizes), sum(max(s) for s in sizes))
    got = choose(costs, sizes, budget)
    cost, _ = _brute(costs, sizes, budget)
    assert got.cost == pytest.approx(cost)
    assert got.size == sum(sizes[i][j] for i, j in enumerate(got.options)) <= budget
    assert got.cost == pytest.approx(sum(costs[i][j] for i, j in enumerate(got.options)))
    assert got.exact


def test_a_bigger_budget_never_costs_more_and_the_whole_budget_takes_every_cheapest_option() -> None:
    rng = random.Random(7)
    sizes = [[8, 4, 3] for _ in range(30)]  # int8 / int4 / int3-like
    costs = [[rng.random() * 0.01, rng.random() * 0.1 + 0.01, rng.random() + 0.1] for _ in range(30)]
    previous = float("inf")
    for budget in range(90, 241, 10):
        got = choose(costs, sizes, budget)
        assert got.size <= budget and got.cost <= previous + 1e-12
        previous = got.cost
    assert choose(costs, sizes, 240).options == [0] * 30


def test_a_budget_below_the_smallest_options_is_refused() -> None:
    with pytest.raises(InfeasibleBudget, match="below the smallest possible total, 7"):
        choose([[1.0, 2.0], [1.0, 0.5]], [[3, 4], [4, 5]], 6)


def test_a_frontier_over_its_cap_rounds_sizes_up_and_stays_within_the_budget() -> None:
    rng = random.Random(3)
    sizes = [[rng.randint(100, 10_000) for _ in range(3)] for _ in range(40)]
    costs = [[rng.random() for _ in range(3)] for _ in range(40)]
    budget = sum(sorted(s)[1] for s in sizes)
    exact = choose(costs, sizes, budget)
    capped = choose(costs, sizes, budget, max_states=64)
    assert exact.exact and not capped.exact and exact.frontier_max > 64
    assert capped.size <= budget
    assert exact.cost <= capped.cost <= exact.cost * 1.05


@pytest.mark.parametrize("max_states", [1, 2, 16, 64, 256])
@pytest.mark.parametrize("seed", range(6))
def test_a_capped_frontier_always_answers_a_feasible_budget_and_never_worse_than_greedy(max_states: int, seed: int) -> None:
    rng = random.Random(100 + seed)
    sizes = [[rng.randint(100, 10_000) for _ in range(3)] for _ in range(60)]
    costs = [[rng.random() for _ in range(3)] for _ in range(60)]
    smallest, largest = sum(min(s) for s in sizes), sum(max(s) for s in sizes)
    for budget in (smallest, smallest + (largest - smallest) // 3, largest):
        got = choose(costs, sizes, budget, max_states=max_states)
        greedy = choose_greedy(costs, sizes, budget)
        exact = choose(costs, sizes, budget)
        assert got.size == sum(sizes[i][j] for i, j in enumerate(got.options)) <= budget
        assert exact.cost - 1e-9 <= got.cost <= greedy.cost + 1e-9
        assert greedy.size <= budget and exact.cost <= greedy.cost + 1e-9


def test_greedy_takes_the_best_cost_per_byte_first() -> None:
    # item 0: 10 bytes more saves 5; item 1: 10 bytes more saves 1; room for one upgrade only
    got = choose_greedy([[6.0, 1.0], [2.0, 1.0]], [[10, 20], [10, 20]], 30)
    assert got.options == [1, 0] and got.size == 30 and got.cost == 3.0 and got.method == "greedy"
    with pytest.raises(InfeasibleBudget):
        choose_greedy([[1.0]], [[5]], 4)
