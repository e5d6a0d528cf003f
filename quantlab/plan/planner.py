"""``quantlab plan``: a recipe's weight formats per decoder layer (the output head a group of its own) and its KV
formats per layer, chosen together for the least predicted divergence whose memory at a workload (``batch``
sequences of ``context`` positions) fits a budget. The costs are measured: each weight group by the sensitivity
scan (``quant.mixed.sensitivity``: the group alone in the format, KL over the baseline's top 128 tokens, a lower bound), each KV layer group through the cache
(``kv_scan``: the whole vocabulary). The memory is the weights' layout bytes, every other parameter at its dtype,
the cache's bytes by each format's formula at the workload (``kv.format.layer_kv_bytes``), and the terms no
choice changes that the caller reserves (``overhead``: the activations of the workload's largest forward and the
runtime's own memory), each stated with how it was obtained."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import QuantlabError
from ..kv.format import KVFormat, layer_kv_bytes, layer_windows
from ..quant.format import WeightFormat
from .joint import Group, Option, Plan, choose_plan, frontier, uniform_plans
from .kv_scan import CacheReference, kv_layer_scan
from .measure import Measured
from .overhead import Term


@dataclass
class Workload:
    memory_bytes: int
    context_tokens: int
    batch_size: int


@dataclass
class PlanResult:
    plan: Plan
    uniform: list[Plan]
    frontier: list[Plan]
    groups: list[Group]
    fixed_bytes: int  # every parameter outside the planned linears (the reserved terms apart)
    workload: Workload
    weight_modules: dict[str, tuple[str, ...]]  # weight group name -> its linears
    weight_patterns: dict[str, tuple[str, ...]]  # weight group name -> the globs that select it (an override's)
    kv_layers: dict[str, tuple[int, ...]]  # KV group name -> its decoder layers
    provenance: dict[str, str] = field(default_factory=dict)
    reserved: dict[str, Term] = field(default_factory=dict)  # activations, runtime: bytes no choice changes
    measured: list[Measured] = field(default_factory=list)  # configurations applied whole (``measure``)
    reference: CacheReference | None = field(default=None, repr=False)  # the KV scan's baseline, for measuring


def kv_groups(config: Any, group_layers: int) -> list[tuple[int, ...]]:
    """Consecutive decoder layers of the same attention kind (global, or sliding with one window), at most
    ``group_layers`` to a group."""
    windows = layer_windows(config)
    groups: list[list[int]] = []
    for i, window in enumerate(windows):
        if groups and windows[groups[-1][-1]] == window and len(groups[-1]) < group_layers:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [tuple(g) for g in groups]


def _fixed_bytes(model: torch.nn.Module, selected: list[str]) -> int:
    """Every parameter outside the selected linears' weights, at its dtype (a tied table once)."""
    skip = {id(model.get_submodule(n).weight) for n in selected}
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in skip or p.untyped_storage().data_ptr() in seen:
            continue
        seen.add(p.untyped_storage().data_ptr())
        total += p.numel() * p.element_size()
    return total


def plan_model(model: torch.nn.Module, baseline: WeightFormat, weight_formats: list[WeightFormat],
               baseline_kv: KVFormat, kv_formats: list[KVFormat], calibration: Any, scan_samples: list[torch.Tensor],
               kv_windows: torch.Tensor, workload: Workload, kv_group_layers: int = 1, chunk_tokens: int = 64,
               reserved: dict[str, Term] | None = None, log: Callable[[str], None] = lambda _: None) -> PlanResult:
    """Measure every option's divergence and bytes, then choose. ``scan_samples``: the weight scan's windows;
    ``kv_windows``: ``[n, window]`` token ids fed through the cache for the KV scan; ``reserved``: memory beside
    the parameters and the cache that no choice changes (``overhead``), held out of the budget."""
    from ..quant.apply import select_linears
    from ..quant.mixed.groups import group_linears
    from ..quant.mixed.sensitivity import scan

    selected, heads = select_linears(model)  # the output head apart: a group of its own
    base = model.get_submodule(selected[0]).weight.dtype
    weight_groups = group_linears(model, selected + heads, "layer")
    shapes = {n: tuple(model.get_submodule(n).weight.shape) for n in selected + heads}
    log(f"weight scan: {len(weight_groups)} groups (decoder layers, output head) x {len(weight_formats)} formats")
    rows = scan(model, weight_groups, weight_formats, scan_samples, calibration) if weight_formats else []
    cost = {(r["group"], r["format"]): float(r["kl_divergence_mean"]) for r in rows}
    table = model.get_input_embeddings().weight
    groups: list[Group] = []
    for g in weight_groups:
        dense = sum(o * i for o, i in (shapes[n] for n in g.modules)) * base.itemsize
        # a head tied to the lookup table: quantizing it keeps the table beside it, unless the format's head
        # holds the lookup (one table in its blocks)
        kept_table = table.numel() * base.itemsize * sum(model.get_submodule(n).weight is table for n in g.modules)
        options = [Option(baseline.label, dense, 0.0)]
        options += [Option(f.scheme_label, sum(f.linear_weight_bytes(*shapes[n], base) for n in g.modules)
                           + (0 if f.head_holds_lookup_table else kept_table), cost[(g.name, f.scheme_label)])
                    for f in weight_formats]
        groups.append(Group(f"weights {g.name}", "weights", tuple(options), in_uniform=not set(g.modules) & set(heads)))
    config = model.config
    layers = kv_groups(config, kv_group_layers)
    log(f"KV scan: {len(layers)} layer groups x {len(kv_formats)} formats, {kv_windows.shape[0]} windows of "
        f"{kv_windows.shape[1]} tokens through the cache")
    reference = CacheReference(model, kv_windows, baseline_kv, chunk_tokens, batch_size=1)
    kv_rows = kv_layer_scan(reference, layers, kv_formats)
    kv_cost = {(r.layers, r.kv_format): r.kl_nats for r in kv_rows}
    per_layer = {f.label: layer_kv_bytes(f, config, workload.batch_size, workload.context_tokens, base)
                 for f in [baseline_kv, *kv_formats]}
    for label, found in per_layer.items():
        if any(b is None for b in found):
            raise QuantlabError(f"KV format {label} leaves its layout to a backend: no bytes to plan with")
    for lay in layers:
        options = [Option(f.label, sum(per_layer[f.label][i] for i in lay),  # type: ignore[misc]
                          0.0 if f is baseline_kv else kv_cost[(lay, f.label)]) for f in [baseline_kv, *kv_formats]]
        groups.append(Group(f"kv layers {'-'.join(map(str, (lay[0], lay[-1]))) if len(lay) > 1 else lay[0]}", "kv",
                            tuple(options)))
    reserved = dict(reserved or {})
    parameters = _fixed_bytes(model, selected + heads)  # a tied table counted in its head's group
    fixed = parameters + sum(t.bytes for t in reserved.values())
    plan = choose_plan(groups, workload.memory_bytes, fixed)
    smallest = fixed + sum(min(o.bytes for o in g.options) for g in groups)
    largest = fixed + sum(max(o.bytes for o in g.options) for g in groups)
    budgets = [smallest + (largest - smallest) * k // 24 for k in range(25)]
    provenance = {
        "weights": f"each decoder layer's linears, and the output head, alone in each format, KL over the baseline's "
                   f"top 128 tokens (a lower bound) on {len(scan_samples)} calibration windows of {scan_samples[0].shape[-1]} tokens",
        "kv": f"each group of {kv_group_layers} layer(s) alone in each format, KL over the whole vocabulary through "
              f"the cache ({chunk_tokens} tokens a step) on {kv_windows.shape[0]} windows of {kv_windows.shape[1]} "
              f"tokens; the workload's context is {workload.context_tokens} (a shorter scan context is an "
              "extrapolation)",
        "memory": "weights by each format's layout formula, other parameters at their dtype, the cache by each "
                  "format's formula at the workload (sliding layers at their window)"
                  + "".join(f"; {name} {t.method}" for name, t in reserved.items())
                  + ("" if "activations" in reserved else "; activations and workspace not included")
                  + ("" if "runtime" in reserved else "; runtime overhead not included"),
        "prediction": "the sum of the chosen options' KL (additivity assumed: measure the plan to check it)",
    }
    return PlanResult(plan, uniform_plans(groups, workload.memory_bytes, fixed), frontier(groups, budgets, fixed),
                      groups, parameters, workload, {f"weights {g.name}": g.modules for g in weight_groups},
                      {f"weights {g.name}": g.patterns for g in weight_groups},
                      {g.name: lay for g, lay in zip(groups[len(weight_groups):], layers)}, provenance, reserved,
                      reference=reference)


def deployable(result: PlanResult, baseline: WeightFormat, weight_formats: list[WeightFormat],
               baseline_kv: KVFormat, kv_formats: list[KVFormat]) -> dict[str, Any]:
    """The plan as recipe entries: the weights as the baseline with overrides per chosen group, the cache as a
    ``per-layer`` KV format (or the one format every layer took)."""
    from ..kv.per_layer import kv_format_entry
    from ..quant.format import format_entry

    by_label = {f.scheme_label: f for f in weight_formats}
    overrides: dict[str, list[str]] = {}
    kv_layers: dict[str, list[int]] = {}
    for name, option in result.plan.choice.items():
        if name in result.weight_modules and option.label in by_label:
            overrides.setdefault(option.label, []).extend(result.weight_patterns[name])
        elif name in result.kv_layers:
            kv_layers.setdefault(option.label, []).extend(result.kv_layers[name])
    weights = {**format_entry(baseline), "overrides": [{"modules": mods, **format_entry(by_label[label])}
                                                        for label, mods in overrides.items()]}
    kv_by_label = {f.label: f for f in [baseline_kv, *kv_formats]}
    if len(kv_layers) == 1:
        kv = kv_format_entry(kv_by_label[next(iter(kv_layers))])
    else:
        kv = {"format": "per-layer", "default": kv_format_entry(baseline_kv),
              "layers": [{"layers": sorted(lay), **kv_format_entry(kv_by_label[label])}
                         for label, lay in kv_layers.items() if label != baseline_kv.label]}
    return {"weights": weights, "kv_cache": kv}


def write_plan(result: PlanResult, entries: dict[str, Any], out: Path, serve: list[str] | None = None) -> Path:
    """plan.md (the frontier figure, the format of each layer's weights and cache, the memory by term beside the
    budget, the choice per group, the uniform configurations, the frontier and how every figure was obtained),
    how to serve it (``serve``: ``serve.serve_lines``), plan-frontier.svg, plan.json and plan-entries.yaml (its
    weight and KV entries, as a recipe writes them)."""
    import json

    import yaml

    from ..files import atomic_write_text
    from .report import frontier_svg, layer_map

    out.mkdir(parents=True, exist_ok=True)
    w = result.workload
    mib = 2 ** 20
    kinds = result.plan.bytes_by_kind
    lines = [f"# Plan: {w.batch_size} x {w.context_tokens:,} positions within {w.memory_bytes / mib:,.1f} MiB", "",
             f"Predicted mean KL **{result.plan.predicted_kl_nats:.5f} nats**, memory "
             f"**{result.plan.total_bytes / mib:,.1f} MiB** at the workload.", "",
             "![memory against predicted KL](plan-frontier.svg)", "", "## Layers", "", *layer_map(result)]
    memory = [("weights (planned linears)", kinds.get("weights", 0), "each format's layout formula"),
              ("KV cache", kinds.get("kv", 0), f"each layer's format at {w.batch_size} x {w.context_tokens:,} positions, "
               "sliding layers at their window"),
              ("other parameters", result.fixed_bytes, "at their dtype (embedding, norms, an untied head)")]
    memory += [(name, t.bytes, t.method) for name, t in result.reserved.items()]
    lines += ["", "## Memory at the workload", "", "| term | MiB | how |", "|---|---:|---|"]
    lines += [f"| {name} | {b / mib:,.1f} | {how} |" for name, b, how in memory]
    lines += [f"| **total** | **{result.plan.total_bytes / mib:,.1f}** | the budget: {w.memory_bytes / mib:,.1f} |"]
    if result.measured:
        lines += ["", "## Predicted and measured", "",
                  "Each configuration applied whole (its weights on a copy of the model, its cache) and its KL "
                  "measured through the cache on the KV scan's windows, over the whole vocabulary; the prediction "
                  "is the sum of its groups' scan rows.", "",
                  "| configuration | MiB | predicted KL | measured KL | measured / predicted |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {m.name} | {m.total_bytes / mib:,.1f} | {m.predicted_kl_nats:.4g} | {m.kl_nats:.4g} | "
                  + (f"{m.kl_nats / m.predicted_kl_nats:.2f} |" if m.predicted_kl_nats > 0 else "— |")
                  for m in result.measured]
        plan = next((m for m in result.measured if m.name == "plan"), None)
        fitting = [m for m in result.measured if m.name != "plan"]
        if plan is not None and fitting:
            best = min(fitting, key=lambda m: m.kl_nats)
            lines += ["", f"Measured, the plan's KL is {1 - plan.kl_nats / best.kl_nats:.0%} below the best uniform "
                      f"configuration that fits ({best.name}, {best.kl_nats:.4g} nats; the plan {plan.kl_nats:.4g})." if best.kl_nats > 0 else
                      f"The best uniform configuration that fits ({best.name}) measured no divergence."]
    lines += ["", "## Choice per group", "", "| group | format | MiB | KL (nats) |", "|---|---|---|---|"]
    lines += [f"| {name} | {o.label} | {o.bytes / mib:,.2f} | {o.kl_nats:.5f} |" for name, o in result.plan.choice.items()]
    lines += ["", "## Uniform configurations", "", "| weights | KV cache | MiB | fits | predicted KL |", "|---|---|---|---|---|"]
    lines += [f"| {u.uniform[0]} | {u.uniform[1]} | {u.total_bytes / mib:,.1f} | "
              f"{'yes' if u.total_bytes <= w.memory_bytes else 'no'} | {u.predicted_kl_nats:.5f} |"
              for u in sorted(result.uniform, key=lambda u: u.total_bytes) if u.uniform]
    lines += ["", "## Frontier", "", "| budget MiB | memory MiB | predicted KL |", "|---|---|---|"]
    lines += [f"| {p.budget_bytes / mib:,.1f} | {p.total_bytes / mib:,.1f} | {p.predicted_kl_nats:.5f} |"
              for p in result.frontier]
    atomic_write_text(out / "plan-frontier.svg", frontier_svg(result))
    lines += ["", *serve] if serve else []
    lines += ["", "## How the figures were obtained", ""] + [f"- {k}: {v}" for k, v in result.provenance.items()]
    if not serve:
        lines += ["", "Measure it: `quantlab run plan-recipe.yaml` (the plan beside the recipe's own formats)."]
    lines += [""]
    atomic_write_text(out / "plan.md", "\n".join(lines))
    atomic_write_text(out / "plan.json", json.dumps({
        "workload": {"memory_bytes": w.memory_bytes, "context_tokens": w.context_tokens, "batch_size": w.batch_size},
        "predicted_kl_nats": result.plan.predicted_kl_nats, "total_bytes": result.plan.total_bytes,
        "bytes_by_kind": result.plan.bytes_by_kind, "exact": result.plan.exact,
        "reserved": {name: {"bytes": t.bytes, "method": t.method} for name, t in result.reserved.items()},
        "measured": [{"configuration": m.name, "total_bytes": m.total_bytes, "predicted_kl_nats": m.predicted_kl_nats,
                      "kl_nats": m.kl_nats} for m in result.measured],
        "choice": {k: {"format": o.label, "bytes": o.bytes, "kl_nats": o.kl_nats} for k, o in result.plan.choice.items()},
        "uniform": [{"weights": u.uniform[0], "kv_cache": u.uniform[1], "total_bytes": u.total_bytes,
                     "predicted_kl_nats": u.predicted_kl_nats} for u in result.uniform if u.uniform],
        "provenance": result.provenance, "entries": entries}, indent=1))
    atomic_write_text(out / "plan-entries.yaml", yaml.safe_dump(entries, sort_keys=False))
    return out / "plan.md"
