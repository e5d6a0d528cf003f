"""The joint choice: for every group (a set of linears of the weights, or a set of layers of the KV cache) one of
its options, the least predicted divergence whose bytes at the workload fit a budget. Solved exactly by the
multiple-choice knapsack of budgeted mixed precision (``quant.mixed.knapsack``) with the weights' and the cache's
groups as items of one problem, so a byte saved in the cache can buy precision in the weights and the reverse.
A group's cost is the divergence measured with that group alone changed from the baseline; the plan's prediction
is their sum (additivity, which the plan's own measurement checks)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..quant.mixed.knapsack import InfeasibleBudget, choose

GroupKind = Literal["weights", "kv"]


@dataclass(frozen=True)
class Option:
    """One format for a group: its bytes at the workload and the divergence measured with it there (nats)."""

    label: str
    bytes: int
    kl_nats: float


@dataclass(frozen=True)
class Group:
    """Linears (``kind`` weights) or decoder layers' caches (``kind`` kv) that take one format together."""

    name: str
    kind: GroupKind
    options: tuple[Option, ...]
    in_uniform: bool = True  # False: a uniform configuration keeps its first option (the output head, which a
    # weight format leaves as it is unless named)


@dataclass
class Plan:
    """The option chosen per group, its total bytes (with the bytes no choice changes) and predicted KL."""

    choice: dict[str, Option]
    total_bytes: int
    predicted_kl_nats: float
    budget_bytes: int
    exact: bool
    uniform: tuple[str, str] | None = None  # (weight option, KV option) of a uniform configuration
    bytes_by_kind: dict[str, int] = field(default_factory=dict)


def _plan(groups: list[Group], options: list[int], fixed_bytes: int, budget_bytes: int, exact: bool,
          uniform: tuple[str, str] | None = None) -> Plan:
    choice = {g.name: g.options[i] for g, i in zip(groups, options)}
    by_kind = {"fixed": fixed_bytes}
    for g in groups:
        by_kind[g.kind] = by_kind.get(g.kind, 0) + choice[g.name].bytes
    return Plan(choice, fixed_bytes + sum(o.bytes for o in choice.values()), sum(o.kl_nats for o in choice.values()),
                budget_bytes, exact, uniform, by_kind)


def choose_plan(groups: list[Group], budget_bytes: int, fixed_bytes: int = 0) -> Plan:
    """The least predicted KL with ``fixed_bytes`` (what no choice changes: embeddings, norms, activations,
    overhead) plus every group's option within ``budget_bytes``. Raises ``InfeasibleBudget`` when even the
    smallest options do not fit."""
    if not groups:
        raise ValueError("nothing to choose: no groups")
    room = budget_bytes - fixed_bytes
    if room < 0:
        raise InfeasibleBudget(f"the budget of {budget_bytes} bytes is below the {fixed_bytes} bytes no choice changes")
    found = choose([[o.kl_nats for o in g.options] for g in groups], [[o.bytes for o in g.options] for g in groups],
                   room)
    return _plan(groups, found.options, fixed_bytes, budget_bytes, found.exact)


def uniform_plans(groups: list[Group], budget_bytes: int, fixed_bytes: int = 0) -> list[Plan]:
    """Every uniform configuration (one weight option everywhere, one KV option everywhere) that every group of
    its kind offers, fitting or not (``total_bytes`` against ``budget_bytes`` says which fit)."""
    def common(kind: str) -> list[str]:
        labels = [[o.label for o in g.options] for g in groups if g.kind == kind and g.in_uniform]
        return [label for label in labels[0] if all(label in row for row in labels)] if labels else [""]

    out = []
    for w in common("weights"):
        for k in common("kv"):
            picks = [0 if not g.in_uniform else
                     next(i for i, o in enumerate(g.options) if o.label == (w if g.kind == "weights" else k))
                     for g in groups]
            out.append(_plan(groups, picks, fixed_bytes, budget_bytes, True, (w, k)))
    return out


def frontier(groups: list[Group], budgets_bytes: list[int], fixed_bytes: int = 0) -> list[Plan]:
    """The best plan at each budget that admits one (ascending budgets: the Pareto frontier of bytes against
    predicted KL, a budget that buys nothing better than a smaller one left out)."""
    out: list[Plan] = []
    for budget in sorted(budgets_bytes):
        try:
            plan = choose_plan(groups, budget, fixed_bytes)
        except InfeasibleBudget:
            continue
        if not out or plan.predicted_kl_nats < out[-1].predicted_kl_nats:
            out.append(plan)
    return out
