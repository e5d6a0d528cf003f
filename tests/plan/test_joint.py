"""The joint weights + KV choice against brute force over every combination of a small instance, its frontier and
the uniform configurations beside it."""
import itertools
import random

import pytest

from quantlab.plan.joint import Group, Option, choose_plan, frontier, uniform_plans
from quantlab.quant.mixed.knapsack import InfeasibleBudget

WEIGHTS = [("bf16", 4.0, 0.0), ("int8", 2.0, 0.002), ("int4", 1.0, 0.03)]  # (label, bytes per unit, KL per unit)
KV = [("native", 4.0, 0.0), ("int8", 2.0, 0.004), ("int4", 1.0, 0.05)]


def _groups(seed: int) -> list[Group]:
    """Three weight groups and four KV layers (one a sliding layer, cheap to store) of uneven sizes and
    sensitivities."""
    rng = random.Random(seed)
    groups = []
    for i in range(3):
        size, sens = rng.randint(50, 200), rng.uniform(0.2, 3)
        groups.append(Group(f"layers.{i}", "weights",
                            tuple(Option(n, int(b * size), k * sens) for n, b, k in WEIGHTS)))
    for i in range(4):
        size, sens = (20 if i == 1 else rng.randint(100, 400)), rng.uniform(0.2, 3)
        groups.append(Group(f"kv.{i}", "kv", tuple(Option(n, int(b * size), k * sens) for n, b, k in KV)))
    return groups


def _brute(groups: list[Group], room: int) -> float:
    best = float("inf")
    for picks in itertools.product(*(g.options for g in groups)):
        if sum(o.bytes for o in picks) <= room:
            best = min(best, sum(o.kl_nats for o in picks))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_the_joint_choice_is_brute_force_s_optimum_at_every_budget(seed: int) -> None:
    groups = _groups(seed)
    smallest = sum(min(o.bytes for o in g.options) for g in groups)
    largest = sum(max(o.bytes for o in g.options) for g in groups)
    fixed = 1000
    for room in range(smallest, largest + 1, max(1, (largest - smallest) // 23)):
        plan = choose_plan(groups, fixed + room, fixed)
        assert plan.exact and plan.total_bytes <= fixed + room
        assert plan.predicted_kl_nats == pytest.approx(_brute(groups, room), abs=1e-12)
        assert plan.total_bytes == fixed + sum(o.bytes for o in plan.choice.values())
        assert plan.bytes_by_kind["fixed"] + plan.bytes_by_kind["weights"] + plan.bytes_by_kind["kv"] == plan.total_bytes
    with pytest.raises(InfeasibleBudget):
        choose_plan(groups, fixed + smallest - 1, fixed)


def test_the_plan_is_at_least_as_good_as_every_uniform_configuration_that_fits() -> None:
    groups = _groups(7)
    uniform = uniform_plans(groups, 0)
    assert len(uniform) == len(WEIGHTS) * len(KV)
    assert {u.uniform for u in uniform} == {(w, k) for w, *_ in WEIGHTS for k, *_ in KV}
    for u in uniform:
        plan = choose_plan(groups, u.total_bytes)
        assert plan.predicted_kl_nats <= u.predicted_kl_nats + 1e-12
    # between the uniform points the joint plan mixes formats and kinds, and is strictly better somewhere
    totals = sorted({u.total_bytes for u in uniform})
    gains = []
    for low, high in zip(totals, totals[1:]):
        budget = (low + high) // 2
        best_uniform = min(u.predicted_kl_nats for u in uniform if u.total_bytes <= budget)
        gains.append(best_uniform - choose_plan(groups, budget).predicted_kl_nats)
    assert min(gains) >= -1e-12 and max(gains) > 0


def test_the_frontier_only_improves_as_the_budget_grows() -> None:
    groups = _groups(3)
    largest = sum(max(o.bytes for o in g.options) for g in groups)
    budgets = list(range(0, largest + 50, 50))
    points = frontier(groups, budgets)
    assert points and all(a.predicted_kl_nats > b.predicted_kl_nats for a, b in zip(points, points[1:]))
    assert all(a.total_bytes <= a.budget_bytes for a in points)
    assert points[-1].predicted_kl_nats == 0.0  # the largest budget holds every group at full precision
