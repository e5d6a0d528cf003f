"""The Pareto front of (cost, loss) points: the variants no other variant beats on both."""
from __future__ import annotations

import math
from typing import Sequence


def pareto_front(costs: Sequence[float], losses: Sequence[float]) -> list[bool]:
    """For each point, whether no other point has cost <= and loss <= with at least one strictly smaller.

    NaN points (failed or unmeasured variants) are never on the front.
    """
    if len(costs) != len(losses):
        raise ValueError("costs and losses must have the same length")
    pts = list(zip(costs, losses))
    valid = [not (math.isnan(c) or math.isnan(x)) for c, x in pts]
    front = []
    for i, (c, x) in enumerate(pts):
        if not valid[i]:
            front.append(False)
            continue
        dominated = any(valid[j] and pts[j][0] <= c and pts[j][1] <= x and (pts[j][0] < c or pts[j][1] < x)
                        for j in range(len(pts)) if j != i)
        front.append(not dominated)
    return front
