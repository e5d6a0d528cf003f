"""The multiple-choice knapsack behind budgeted mixed precision: one option per item, the least total cost
within a size budget.

Solved exactly by dynamic programming over Pareto frontiers (Nemhauser and Ullmann): after each item, only the
partial assignments that no other beats in both size and cost are kept, and those over the budget are dropped.
The frontier holds at most one state per distinct total size, and in practice far fewer (its expected size is
polynomial for costs with any noise in them, Beier and Vöcking 2003); a model's linears are a few hundred items
with a handful of options each. Should a frontier still outgrow ``max_states``, sizes are rounded up to a coarser
unit from there on (before the budget check, so every state kept is within the true budget), and the answer is
reported as not exact; it is then compared with a greedy choice (the cheapest option per extra byte, one step at
a time, from the smallest options), and the better of the two is returned, so a rounded solve never answers worse
than greedy and a feasible budget always has an answer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Choice:
    options: list[int]  # the option chosen for each item
    cost: float
    size: int  # in the items' own units (bytes)
    exact: bool  # False when sizes had to be rounded up to keep the frontier small
    frontier_max: int  # the largest frontier met (states)
    method: str = "frontier"  # frontier (exact, or rounded when not exact) | greedy (better than the rounded one)


class InfeasibleBudget(ValueError):
    pass


def choose(costs: list[list[float]], sizes: list[list[int]], budget: int, max_states: int = 1 << 20) -> Choice:
    """For each item ``i`` one option ``j`` minimizing ``Σ costs[i][j]`` subject to ``Σ sizes[i][j] ≤ budget``."""
    if len(costs) != len(sizes) or any(len(c) != len(s) or not c for c, s in zip(costs, sizes)):
        raise ValueError("costs and sizes need one non-empty, equally long row of options per item")
    smallest = sum(min(s) for s in sizes)
    if smallest > budget:
        raise InfeasibleBudget(f"the budget of {budget} is below the smallest possible total, {smallest}")
    size = np.zeros(1, dtype=np.int64)  # frontier states: total size, total cost, and how each was reached
    cost = np.zeros(1, dtype=np.float64)
    steps: list[tuple[np.ndarray, np.ndarray]] = []  # per item: (parent state, option) of each new state
    rest_min = np.cumsum([min(s) for s in sizes][::-1])[::-1].tolist() + [0]  # least size the items after need
    unit, frontier_max = 1, 1
    for i, (c_row, s_row) in enumerate(zip(costs, sizes)):
        s_opt = np.asarray(s_row, dtype=np.int64)
        c_opt = np.asarray(c_row, dtype=np.float64)
        new_size = (size[:, None] + s_opt[None, :]).ravel()
        new_cost = (cost[:, None] + c_opt[None, :]).ravel()
        parent = np.repeat(np.arange(size.size), s_opt.size)
        option = np.tile(np.arange(s_opt.size), size.size)
        if unit > 1:  # rounded up before the check, so a state that passes is within the true budget
            new_size = -(-new_size // unit) * unit
        fits = new_size + rest_min[i + 1] <= budget  # room must stay for the cheapest options of the rest
        new_size, new_cost, parent, option = new_size[fits], new_cost[fits], parent[fits], option[fits]
        order = np.lexsort((new_cost, new_size))  # by size, then cost
        new_size, new_cost, parent, option = new_size[order], new_cost[order], parent[order], option[order]
        best_before = np.minimum.accumulate(np.concatenate(([np.inf], new_cost[:-1])))
        keep = new_cost < best_before  # strictly cheaper than every state no larger than it
        size, cost = new_size[keep], new_cost[keep]
        steps.append((parent[keep], option[keep]))
        frontier_max = max(frontier_max, size.size)
        while size.size > max_states:
            unit *= 2
            rounded = -(-size // unit) * unit
            # costs fall as sizes grow along a frontier: the last state of each rounded size is its cheapest
            pick = np.flatnonzero(np.concatenate((rounded[1:] != rounded[:-1], [True])))
            pick = pick[rounded[pick] + rest_min[i + 1] <= budget]
            size, cost = rounded[pick], cost[pick]
            steps[-1] = (steps[-1][0][pick], steps[-1][1][pick])
    if unit > 1:
        greedy = choose_greedy(costs, sizes, budget)
        if size.size == 0 or greedy.cost < float(cost.min()):
            return Choice(greedy.options, greedy.cost, greedy.size, False, frontier_max, "greedy")
    best = int(np.argmin(cost))
    options: list[int] = []
    state = best
    for parent, option in reversed(steps):
        options.append(int(option[state]))
        state = int(parent[state])
    options.reverse()
    true_size = sum(sizes[i][j] for i, j in enumerate(options))
    return Choice(options, float(sum(costs[i][j] for i, j in enumerate(options))), true_size, unit == 1, frontier_max)


def choose_greedy(costs: list[list[float]], sizes: list[list[int]], budget: int) -> Choice:
    """From each item's smallest option (the cheapest among equal sizes), take one step at a time the change of one
    item's option that lowers the total cost most per extra byte and still fits (a change that saves bytes too
    comes first); stop when none is left."""
    options = [min(range(len(s)), key=lambda j, s=s, c=c: (s[j], c[j])) for c, s in zip(costs, sizes)]
    total = sum(sizes[i][j] for i, j in enumerate(options))
    if total > budget:
        raise InfeasibleBudget(f"the budget of {budget} is below the smallest possible total, {total}")
    while True:
        best: tuple[float, int, int] | None = None
        for i, (c_row, s_row) in enumerate(zip(costs, sizes)):
            now = options[i]
            for j, (c, s) in enumerate(zip(c_row, s_row)):
                gain, extra = c_row[now] - c, s - s_row[now]
                if gain <= 0 or total + extra > budget:
                    continue
                rate = float("inf") if extra <= 0 else gain / extra
                if best is None or rate > best[0]:
                    best = (rate, i, j)
        if best is None:
            break
        _, i, j = best
        total += sizes[i][j] - sizes[i][options[i]]
        options[i] = j
    return Choice(options, float(sum(costs[i][j] for i, j in enumerate(options))), total, False, 0, "greedy")
