"""``quantlab sensitivity``: how much each part of a model minds being quantized.

One group of linears at a time (a decoder layer, a module type across layers, or one module) is put in the
format, everything else left as the recipe's baseline, and the divergence from the baseline is measured on a
short stretch of the perplexity text. Each group is a variant of a generated recipe (the format with an
``include`` of that group) run by the ordinary runner into ``<out>/``: progress per variant, and an interrupted
sweep resumes from the variants' records. The model is loaded once and copied for each group. The ranked table
(``sensitivity.csv``, ``sensitivity.md``) and a heatmap of layers × module types (``sensitivity.svg``) are
written beside the records.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from .errors import QuantlabError
from .quant import WEIGHT_FORMATS, WeightFormat

Granularity = Literal["layer", "module-type", "module"]
GRANULARITIES = ("layer", "module-type", "module")


@dataclass(frozen=True)
class ModuleGroup:
    name: str  # what the table calls it: "layer 3", "down_proj" or a module's name
    patterns: tuple[str, ...]  # include globs
    layer: int | None  # decoder layer, where the group lies in one
    kind: str | None  # module type (the last part of the name), where the group has one


def module_groups(model_spec: Any, granularity: Granularity) -> list[ModuleGroup]:
    """The groups of the model's default-selected linears, from its config (no weights read)."""
    from transformers import AutoModelForCausalLM

    from .models import load_config
    from .quant.apply import select_linears
    from .quant.sequential import decoder_layers

    config = load_config(model_spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=model_spec.trust_remote_code)
    names, _ = select_linears(model)
    layers = decoder_layers(model)
    prefix = next(name for name, m in model.named_modules() if m is layers) + "."

    def layer_of(name: str) -> int | None:
        return int(name[len(prefix):].split(".", 1)[0]) if name.startswith(prefix) else None

    kinds = list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))
    if granularity == "module":
        return [ModuleGroup(n, (n,), layer_of(n), n.rsplit(".", 1)[-1]) for n in names]
    if granularity == "module-type":
        return [ModuleGroup(k, (f"*.{k}",), None, k) for k in kinds]
    indices = sorted({i for n in names if (i := layer_of(n)) is not None})
    return [ModuleGroup(f"layer {i}", (f"{prefix}{i}.*",), i, None) for i in indices]


def sensitivity_spec(recipe: Any, fmt: WeightFormat, groups: list[ModuleGroup], max_tokens: int) -> dict[str, Any]:
    """The generated recipe: the baseline, then the format on each group alone, scored by divergence."""
    from .recipe import format_spec

    if recipe.evaluations.perplexity is None:
        raise QuantlabError(f"{recipe.source}: sensitivity scores divergence on the perplexity text: add "
                            "evaluations.perplexity")
    baseline = recipe.baseline_variant
    spec = recipe.to_spec()
    ppl = {**spec["evaluations"]["perplexity"], "max_tokens": max_tokens}
    entry = format_spec(WEIGHT_FORMATS, fmt)
    return {
        **{k: spec[k] for k in ("model", "calibration", "device", "seed")},
        "name": f"{recipe.name}-sensitivity", "description": f"sensitivity of {recipe.name} to {fmt.label}",
        "weights": [format_spec(WEIGHT_FORMATS, baseline.weight)] + [{**entry, "include": list(g.patterns)}
                                                                     for g in groups],
        "baseline": baseline.weight.label,
        "workload": {"batch_size": 1, "prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1},
        "evaluations": {"perplexity": ppl, "divergence": {"top_k": 128}},
        "isolation": "none",
    }


def rank(rows: list[dict[str, Any]], groups: list[ModuleGroup], labels: list[str]) -> list[dict[str, Any]]:
    """One row per group (``labels``: its variant's), most sensitive (largest mean KL) first."""
    by_label = {r["variant"]: r for r in rows}
    out = []
    for g, label in zip(groups, labels):
        r = by_label.get(label, {})
        out.append({"group": g.name, "layer": g.layer, "module_type": g.kind, "variant": label,
                    "status": r.get("status", "missing"), "kl_divergence_mean": r.get("kl_divergence_mean"),
                    "kl_divergence_p99": r.get("kl_divergence_p99"),
                    "top1_agreement_percent": r.get("top1_agreement_percent"),
                    "delta_perplexity": r.get("delta_perplexity"), "weight_bytes": r.get("weight_bytes")})
    return sorted(out, key=lambda r: -(r["kl_divergence_mean"] if r["kl_divergence_mean"] is not None else -1))


def heatmap(table: list[dict[str, Any]], title: str) -> str:
    """Mean KL by decoder layer (rows) and module type (columns) as an SVG."""
    from .report.plots import STYLE, plt, to_svg

    layers = sorted({r["layer"] for r in table if r["layer"] is not None}) or [None]
    kinds = list(dict.fromkeys(r["module_type"] for r in table if r["module_type"] is not None)) or [None]
    grid = torch.full((len(layers), len(kinds)), float("nan"))
    for r in table:
        if r["kl_divergence_mean"] is None:
            continue
        rows = [layers.index(r["layer"])] if r["layer"] in layers else range(len(layers))
        cols = [kinds.index(r["module_type"])] if r["module_type"] in kinds else range(len(kinds))
        for i in rows:
            for j in cols:
                grid[i, j] = r["kl_divergence_mean"]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(kinds), 1.0 + 0.22 * len(layers)))
        image = ax.imshow(grid.numpy(), aspect="auto", cmap="magma_r")
        ax.set_xticks(range(len(kinds)), [k or "all linears" for k in kinds], rotation=45, ha="right")
        ax.set_yticks(range(len(layers)), ["all layers" if i is None else str(i) for i in layers])
        ax.set_ylabel("decoder layer")
        ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, label="mean KL from the baseline (nats)")
        return to_svg(fig)


def write_tables(out: Path, table: list[dict[str, Any]], fmt: WeightFormat, granularity: str) -> None:
    import pandas as pd

    from .records import atomic_write_text

    pd.DataFrame(table).to_csv(out / "sensitivity.csv", index=False)
    lines = [f"# Sensitivity to {fmt.label} ({granularity})", "",
             "Each row: only this group in the format, everything else as the baseline; most sensitive first.", "",
             "| rank | group | mean KL | KL p99 | top-1 same % | Δppl |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(table, 1):
        def f(key: str, spec: str) -> str:
            return "" if r[key] is None else format(r[key], spec)
        lines.append(f"| {i} | {r['group']} | {f('kl_divergence_mean', '.5f')} | {f('kl_divergence_p99', '.4f')} | "
                     f"{f('top1_agreement_percent', '.2f')} | {f('delta_perplexity', '+.3f')} |")
    lines += ["", "![heatmap](sensitivity.svg)", ""]
    atomic_write_text(out / "sensitivity.md", "\n".join(lines))
    atomic_write_text(out / "sensitivity.svg", heatmap(table, f"{fmt.label}: one {granularity} at a time"))


def run_sensitivity(recipe: Any, fmt: WeightFormat, granularity: Granularity, out: Path, max_tokens: int,
                    log: Any) -> list[dict[str, Any]]:
    from .measurements.context import reuse_loaded_models
    from .recipe import validate_recipe
    from .results import read_jsonl
    from .runner import run_recipe

    groups = module_groups(recipe.model, granularity)
    spec = sensitivity_spec(recipe, fmt, groups, max_tokens)
    generated = validate_recipe(spec, f"{recipe.source} (sensitivity)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sensitivity-recipe.json").write_text(json.dumps(spec, indent=1))
    with reuse_loaded_models():
        run_recipe(generated, out, log=log)
    labels = [v.label for v in generated.variants()[1:]]
    table = rank(read_jsonl(out / "results.jsonl"), groups, labels)
    write_tables(out, table, fmt, granularity)
    return table
