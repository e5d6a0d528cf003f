"""``quantlab plan RECIPE --memory 24GiB --context 32768 --batch 8`` (or the recipe's ``plan:`` section): the
recipe's model, baseline, weight and KV formats and texts, planned by ``planner`` into an output folder, with
``plan-recipe.yaml``: the recipe with the plan's weights and cache added to its own formats, so that ``quantlab
run`` measures the plan, its weights and its cache alone, and every uniform configuration beside it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import QuantlabError
from .measure import Measured, measure_whole
from .overhead import Term, activation_bytes, runtime_bytes
from .planner import Workload, deployable, plan_model, write_plan


def run_plan(recipe: Any, spec: Any, out: Path, log: Callable[[str], None] = lambda _: None) -> Path:
    """Plan ``recipe`` under ``spec`` (a ``run.recipe.PlanSpec``: budget, workload and scan sizes) into ``out``."""
    import yaml

    from ..data import load_text, tokenize
    from ..files import atomic_write_text
    from ..kv.format import layer_windows
    from ..quant.mixed.sensitivity import scan_samples
    from ..run.lifecycle import load_unquantized_baseline
    from ..run.recipe import validate_recipe
    from ..run.sensitivity import beside_baseline
    from .serve import SERVING_TARGETS, serve_lines

    baseline = recipe.baseline_variant.weight
    baseline_kv = recipe.baseline_variant.kv
    weight_formats = beside_baseline(recipe)
    kv_formats = [k for k in recipe.kv_cache if k != baseline_kv]
    if spec.kv_split:
        kv_formats += split_pairs(kv_formats)
    if not weight_formats and not kv_formats:
        raise QuantlabError(f"{recipe.source}: nothing to plan: no weight format that goes beside the baseline one "
                            "layer at a time, and no KV format besides the baseline's")
    loaded, calibration = load_unquantized_baseline(recipe, "a plan starts from")
    text = recipe.evaluations.perplexity.text if recipe.evaluations.perplexity else recipe.calibration.text
    ids = tokenize(loaded.tokenizer, load_text(text)) if loaded.tokenizer is not None else torch.cat(
        [s.reshape(-1) for s in calibration.samples])
    window = min(spec.kv_window_tokens, ids.numel() // spec.kv_windows)
    if window < 2:
        raise QuantlabError(f"{text}: too short for {spec.kv_windows} KV-scan windows")
    model = loaded.model
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    device = next(model.parameters()).device
    reserved = {"activations": activation_bytes(model.config, spec.batch_size, spec.context_tokens,
                                                spec.prefill_chunk_tokens, dtype),
                "runtime": runtime_bytes(device) if spec.runtime_bytes is None else
                Term(spec.runtime_bytes, "given: the recipe's plan.runtime_bytes")}
    workload = Workload(spec.memory_bytes, spec.context_tokens, spec.batch_size)
    result = plan_model(model, baseline, weight_formats, baseline_kv, kv_formats, calibration,
                        scan_samples(calibration, spec.scan_tokens),
                        ids[: spec.kv_windows * window].view(spec.kv_windows, window), workload,
                        spec.kv_group_layers, reserved=reserved, log=log)
    entries = deployable(result, baseline, weight_formats, baseline_kv, kv_formats)
    if spec.measure:
        measure_plan(result, model, entries, [baseline, *weight_formats], [baseline_kv, *kv_formats], calibration, log)
    raw = yaml.safe_load(Path(recipe.source).read_text(encoding="utf-8"))
    # the plan beside the recipe's own formats: every weight x KV pair is measured, the uniform ones among them
    from ..kv.per_layer import build_kv_format
    from ..quant.format import build_format

    new_weights = [] if build_format(entries["weights"]) in recipe.weights else [entries["weights"]]
    new_kv = [] if build_kv_format(entries["kv_cache"]) in recipe.kv_cache else [entries["kv_cache"]]  # a uniform one
    raw.update({"name": f"{recipe.name}-plan", "weights": [*(raw.get("weights") or [baseline.label]), *new_weights],
                "kv_cache": [*(raw.get("kv_cache") or ["native"]), *new_kv]})
    planned_weights, planned_kv = build_format(entries["weights"]), build_kv_format(entries["kv_cache"])
    targets = {to: planned_weights.export_refusal(to) for to in SERVING_TARGETS}
    path = out / "plan-recipe.yaml"
    variant = next(v.label for v in validate_recipe(raw, str(path), out).variants()
                   if v.weight == planned_weights and v.kv == planned_kv)
    exported = [to for to, refusal in targets.items() if refusal is None]
    if exported:  # the run that measures the plan writes its deployable folders from the model it measured
        raw["export"] = [*(raw.get("export") or []), {"variants": [variant], "to": exported}]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False))
    layers = len(layer_windows(model.config))
    return write_plan(result, entries, out, serve_lines(variant, planned_kv, layers, spec.context_tokens,
                                                        spec.batch_size, targets))


def measure_plan(result: Any, model: torch.nn.Module, entries: dict[str, Any], weights: list[Any], kvs: list[Any],
                 calibration: Any, log: Callable[[str], None]) -> None:
    """The plan and every uniform configuration that fits, each applied whole and measured through the cache
    (``measure.measure_whole``), into ``result.measured``."""
    from ..kv.per_layer import build_kv_format
    from ..quant.format import build_format

    weight_by = {getattr(f, "scheme_label", f.label): f for f in weights} | {weights[0].label: weights[0]}
    kv_by = {f.label: f for f in kvs}
    fitting = sorted((u for u in result.uniform if u.uniform and u.total_bytes <= result.workload.memory_bytes),
                     key=lambda u: u.uniform)
    configs = {"plan": (build_format(entries["weights"]), build_kv_format(entries["kv_cache"]))}
    configs |= {f"{u.uniform[0]} + {u.uniform[1]}": (weight_by[u.uniform[0]], kv_by[u.uniform[1]]) for u in fitting}
    found = measure_whole(model, result.reference, configs, calibration, log)
    plans = {"plan": result.plan} | {f"{u.uniform[0]} + {u.uniform[1]}": u for u in fitting}
    result.measured = [Measured(name, plans[name].total_bytes, plans[name].predicted_kl_nats, kl)
                       for name, kl in found.items()]


def split_pairs(formats: list[Any]) -> list[Any]:
    """Keys in one of ``formats`` and values in another (``kv.split``): every ordered pair of distinct stored
    formats that keep the same recent positions in full precision."""
    from ..kv.quantized import PackedKVFormat
    from ..kv.split import SplitKV

    stored = [f for f in formats if isinstance(f, PackedKVFormat) and not isinstance(f, SplitKV)]
    return [SplitKV(keys=k, values=v) for k in stored for v in stored
            if k != v and k.codecs()[2] == v.codecs()[2]]
