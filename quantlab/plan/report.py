"""The plan's figure and layer map: the frontier of memory at the workload against predicted KL with every uniform
configuration on it (``plan-frontier.svg``), and which format each decoder layer's weights and cache took."""
from __future__ import annotations

import re
from typing import Any

from ..report.plots import STYLE, place_labels, plt, to_svg

MIB = 2 ** 20


def frontier_svg(result: Any) -> str:
    """Predicted mean KL against memory at the workload: the frontier over budgets (a line), each uniform weight x
    KV configuration (grey where it fits the budget, hollow where it does not), the plan (red) and the budget."""
    budget = result.workload.memory_bytes / MIB
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        front = sorted((p.total_bytes / MIB, p.predicted_kl_nats) for p in result.frontier)
        if front:
            ax.step([x for x, _ in front], [y for _, y in front], where="post", color="#2c7fb8", lw=1.2,
                    label="frontier (best plan per budget)")
        uniform = [u for u in result.uniform if u.uniform]
        fits = [u for u in uniform if u.total_bytes <= result.workload.memory_bytes]
        over = [u for u in uniform if u.total_bytes > result.workload.memory_bytes]
        ax.scatter([u.total_bytes / MIB for u in fits], [u.predicted_kl_nats for u in fits], color="#8a8a8a",
                   zorder=3, label="uniform, fits")
        ax.scatter([u.total_bytes / MIB for u in over], [u.predicted_kl_nats for u in over], facecolors="none",
                   edgecolors="#8a8a8a", zorder=3, label="uniform, over budget")
        ax.scatter([result.plan.total_bytes / MIB], [result.plan.predicted_kl_nats], color="#c0392b", s=60, zorder=4,
                   label="plan")
        ax.axvline(budget, color="#c0392b", lw=0.8, ls="--", label=f"budget {budget:,.0f} MiB")
        place_labels(ax, [(u.total_bytes / MIB, u.predicted_kl_nats, " + ".join(u.uniform)) for u in uniform])
        ax.set_xlabel(f"memory at {result.workload.batch_size} x {result.workload.context_tokens:,} positions, MiB")
        ax.set_ylabel("predicted mean KL (nats)")
        if any(u.predicted_kl_nats > 0 for u in uniform):
            ax.set_yscale("symlog", linthresh=max(1e-5, min(u.predicted_kl_nats for u in uniform
                                                            if u.predicted_kl_nats > 0)))
        ax.set_ylim(bottom=0)
        ax.legend(frameon=False, fontsize=7)
        return to_svg(fig)


def _layer(names: tuple[str, ...]) -> int | None:
    found = {int(m.group(1)) for n in names if (m := re.search(r"\.layers\.(\d+)\.", f"{n}."))}
    return found.pop() if len(found) == 1 else None


def layer_map(result: Any) -> list[str]:
    """A Markdown table: each decoder layer's weight format and KV format in the plan (keys and values share the
    layer's KV format)."""
    weights: dict[int, str] = {}
    for name, modules in result.weight_modules.items():
        layer = _layer(modules)
        if layer is not None and name in result.plan.choice:
            weights[layer] = result.plan.choice[name].label
    kv = {layer: result.plan.choice[name].label for name, layers in result.kv_layers.items() for layer in layers
          if name in result.plan.choice}
    layers = sorted(set(weights) | set(kv))
    lines = ["| layer | weights | K and V |", "|---|---|---|"]
    lines += [f"| {i} | {weights.get(i, '—')} | {kv.get(i, '—')} |" for i in layers]
    return lines
