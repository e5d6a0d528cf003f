"""Run a recipe: each variant loaded, quantized and measured (in its own process by default), then reported."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from .data import Text, calibration_samples, load_text
from .environment import environment
from .errors import QuantlabError
from .estimate import Estimate, estimate_from_raw, read_raw_config
from .kv import KVFormat
from .measure.bandwidth import copy_bandwidth_bytes_per_s, roofline
from .measure.device import describe_device, resolve_device
from .measure.latency import measure_decode
from .measure.lm_eval_protocol import lm_eval_perplexity, lm_eval_tasks
from .measure.memory import decode_weight_bytes_read, rss_bytes, weight_bytes_analytic, weight_bytes_by_component
from .measure.perplexity import cache_perplexity, perplexity, tokenize
from .models import LoadedModel, load_config, load_model, model_dtype_name, model_location
from .progress import progress
from .quant import quantize_
from .quant.format import Calibration
from .recipe import PerplexityEval, Recipe, Variant, validate_recipe
from .results import MANIFEST_FILE, ResultStore, atomic_write_text

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _machine(recipe: Recipe) -> dict[str, str]:
    """What a result row was measured on; resume reuses only rows of the same machine."""
    return {"host": platform.node(), "device": describe_device(resolve_device(recipe.device))}


def _base_row(recipe: Recipe, variant: Variant) -> dict[str, Any]:
    return {
        **_machine(recipe), "variant": variant.label, "variant_key": variant.key, "recipe": recipe.name,
        "model": recipe.model.label, "weight_format": variant.weight.label, "kv_format": variant.kv.label,
        "batch_size": recipe.workload.points()[0][0], "prompt_tokens": recipe.workload.points()[0][1],
        "new_tokens": recipe.workload.new_tokens,
    }


def _kernel_paths(model: torch.nn.Module) -> str:
    paths = sorted({m.kernel_path for m in model.modules() if hasattr(m, "kernel_path")})
    return ",".join(paths) or "dense"


def _calibration(recipe: Recipe, loaded: LoadedModel) -> Calibration:
    c = recipe.calibration
    if loaded.tokenizer is None:  # synthetic weights: random tokens exercise the same path
        g = torch.Generator().manual_seed(c.seed)
        return Calibration([torch.randint(0, loaded.model.config.vocab_size, (1, c.seq_len), generator=g)
                            for _ in range(c.samples)])
    ids = tokenize(loaded.tokenizer, load_text(c.text))
    return Calibration(calibration_samples(ids, c.samples, c.seq_len, c.seed), loaded.tokenizer)


def _perplexity(ppl: PerplexityEval, model: torch.nn.Module, tokenizer: Any, kv: KVFormat,
                device: torch.device) -> dict[str, Any]:
    text = load_text(ppl.text)
    ids = tokenize(tokenizer, text)
    if ppl.max_tokens is not None and ids.numel() > ppl.max_tokens:
        ids = ids[: ppl.max_tokens]
        text = Text(f"{text.source}[:{ppl.max_tokens} tokens]", tokenizer.decode(ids))
    if ppl.protocol == "kv-chunked":
        return cache_perplexity(model, ids, text, kv, window_tokens=ppl.window_tokens, chunk_tokens=ppl.chunk_tokens,
                                batch_size=ppl.batch_size, device=device)
    if ppl.protocol == "lm-eval":
        return lm_eval_perplexity(model, tokenizer, text, window_tokens=ppl.window_tokens, batch_size=ppl.batch_size,
                                  device=device)
    return perplexity(model, ids, text, protocol=ppl.protocol, window_tokens=ppl.window_tokens,
                      stride_tokens=ppl.stride_tokens, batch_size=ppl.batch_size, device=device)


def measure_variant(recipe: Recipe, variant: Variant) -> dict[str, Any]:
    """Load, quantize and measure one variant in this process."""
    device = resolve_device(recipe.device)
    row = _base_row(recipe, variant)
    row.update(started_at=_now(), rss_before_load_bytes=rss_bytes())
    start = time.perf_counter()
    loaded = load_model(recipe.model, device, recipe.seed)
    model = loaded.model
    calibration = _calibration(recipe, loaded) if variant.weight.requires_calibration else None
    report = quantize_(model, variant.weight, calibration)
    components = weight_bytes_by_component(model)
    row.update(
        quantized_modules=len(report.replaced), kernel_path=_kernel_paths(model), quantize_s=round(time.perf_counter() - start, 3),
        weight_bytes=sum(components.values()), weight_bytes_analytic=weight_bytes_analytic(model),
        decode_weight_bytes_read=decode_weight_bytes_read(model),
        **{f"weight_bytes_{k}": v for k, v in components.items()},
    )
    w = recipe.workload
    points = []
    for batch_size, prompt_tokens in progress(w.points(), "decode points (batch, prompt)"):
        decode = measure_decode(model, variant.kv, batch_size=batch_size, prompt_tokens=prompt_tokens,
                                new_tokens=w.new_tokens, warmup_runs=w.warmup_runs,
                                prefill_repeats=w.prefill_repeats, seed=recipe.seed, device=device, engine=w.engine)
        points.append({"batch_size": batch_size, "prompt_tokens": prompt_tokens, **decode.record(batch_size)})
    row.update(points[0])
    row["decode_points"] = points
    ppl = recipe.evaluations.perplexity
    if ppl is not None:
        row.update(_perplexity(ppl, model, loaded.tokenizer, variant.kv, device))
    if recipe.evaluations.lm_eval_tasks:
        row.update(lm_eval_tasks(model, loaded.tokenizer, recipe.evaluations.lm_eval_tasks, device=device))
    row.update(status="ok", error=None, wall_s=round(time.perf_counter() - start, 3), environment=environment())
    return row


def _failed(recipe: Recipe, variant: Variant, error: str) -> dict[str, Any]:
    return {**_base_row(recipe, variant), "status": "failed", "error": error, "finished_at": _now()}


def measure_variant_safely(recipe: Recipe, variant: Variant) -> dict[str, Any]:
    """``measure_variant``, with any failure (out of memory, unsupported shape, ...) recorded as a failed row."""
    try:
        return measure_variant(recipe, variant)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a failed variant is a result, not the end of the run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if not isinstance(e, QuantlabError):  # an unexpected failure: keep its traceback for the log
            traceback.print_exc(file=sys.stderr)
        return _failed(recipe, variant, f"{type(e).__name__}: {first}")


def _measure_in_subprocess(recipe: Recipe, index: int) -> dict[str, Any]:
    variant = recipe.variants()[index]
    with tempfile.TemporaryDirectory(prefix="quantlab-") as tmp:
        spec, out = Path(tmp) / "recipe.json", Path(tmp) / "row.json"
        spec.write_text(json.dumps(recipe.to_spec()))
        # On a terminal the worker's progress bars show through; otherwise its stderr is kept for the error line.
        stderr = None if sys.stderr.isatty() else subprocess.PIPE
        try:
            proc = subprocess.run([sys.executable, "-m", "quantlab.worker", str(spec), str(index), str(out)],
                                  stdout=subprocess.DEVNULL, stderr=stderr, text=True, timeout=recipe.variant_timeout_s)
        except subprocess.TimeoutExpired:  # run() has killed the worker
            return _failed(recipe, variant, f"timed out after {recipe.variant_timeout_s:g} s (variant_timeout_s)")
        if out.is_file():
            return json.loads(out.read_text())
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        why = lines[-1] if lines else ("killed (out of memory?)" if proc.returncode in (-9, 137) else "see the log above")
        return _failed(recipe, variant, f"worker exited with code {proc.returncode}: {why}")


def _config_estimate(recipe: Recipe, config: Any, log: Log) -> Estimate | None:
    """``quantlab estimate`` of the model, built once per run: the evidence table of its config (as the file
    states it, where there is one) and the bytes it predicts for each variant."""
    try:
        raw, where = read_raw_config(model_location(recipe.model))
    except QuantlabError:
        raw, where = config.to_dict(), "the loaded config"  # e.g. a GGUF file: the config transformers built from it
    try:
        return estimate_from_raw(raw, where, [], [], seq_len=1, dtype=model_dtype_name(recipe.model, config),
                                 dtype_source="the recipe's model.dtype, as loaded")
    except Exception as e:  # noqa: BLE001 - the report then has no estimates; the measurements are unaffected
        log(f"no config estimate ({type(e).__name__}: {e})")
        return None


def _add_config_estimates(row: dict[str, Any], estimate: Estimate | None, recipe: Recipe, variant: Variant) -> None:
    """Put what the config alone predicts beside the measured weight and KV bytes."""
    if estimate is None or row.get("status") != "ok":
        return
    points = row.get("decode_points") or []
    positions = [(p["batch_size"], p.get("kv_cache_tokens") or p["prompt_tokens"] + recipe.workload.new_tokens) for p in points]
    est = estimate.beside_measured(variant.weight, variant.kv, positions)
    kv = est.pop("kv_cache_bytes_estimate")
    row.update(est)
    for point, kv_bytes in zip(points, kv):
        point["kv_cache_bytes_estimate"] = kv_bytes
    if points:
        row["kv_cache_bytes_estimate"] = kv[0]


def run_recipe(recipe: Recipe, out_dir: Path | None = None, *, log: Log = _stderr) -> Path:
    """Run every variant not already finished in ``out_dir``, then write the report. Returns ``out_dir``."""
    from .report import write_report

    out_dir = Path(out_dir or Path("reports") / recipe.name)
    config = load_config(recipe.model)  # fail before writing anything if the model cannot be found
    for i, kv in enumerate(recipe.kv_cache):
        problem = kv.check(config)
        if problem:
            raise QuantlabError(f"kv_cache[{i}] ({kv.label}): {problem}")
    device = resolve_device(recipe.device)
    variants = recipe.variants()
    keys = [v.key for v in variants]
    store = ResultStore(out_dir)
    stale = [k for k in store.rows if k not in keys]
    for k in stale:
        del store.rows[k]
    if stale:
        log(f"dropping {len(stale)} result rows of a different recipe from {out_dir}")
    here = _machine(recipe)
    elsewhere = [k for k, r in store.rows.items() if any(r.get(field) != value for field, value in here.items())]
    for k in elsewhere:  # resume reuses this machine's rows only (e.g. not an example report from the repository)
        del store.rows[k]
    if elsewhere:
        log(f"{len(elsewhere)} result rows in {out_dir} were measured on another machine: measuring them here")
    bandwidth = copy_bandwidth_bytes_per_s(device)
    log(f"memory bandwidth (copy): {bandwidth / 1e9:.1f} GB/s")
    estimate = _config_estimate(recipe, config, log)
    manifest = {
        "memory_bandwidth_bytes_per_s": int(bandwidth),
        "memory_bandwidth_method": "median of 5 copies of 256 MiB (read + write), device synchronized",
        "recipe": recipe.to_spec(), "baseline": recipe.baseline_label, "variant_keys": keys,
        "variants": [v.label for v in variants], "complete": False, "started_at": _now(), "environment": environment(),
        "model_evidence": [vars(e) for e in estimate.architecture.evidence] if estimate else [],
    }
    atomic_write_text(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=1))
    store.flush()
    for i, variant in enumerate(variants):
        tag = f"[{i + 1}/{len(variants)}] {variant.label}"
        if store.finished(variant.key):
            log(f"{tag}: already measured, skipped")
            continue
        log(f"{tag}: running")
        row = _measure_in_subprocess(recipe, i) if recipe.isolation == "process" else measure_variant_safely(recipe, variant)
        row.update(roofline(row, bandwidth))
        _add_config_estimates(row, estimate, recipe, variant)
        for point in row.get("decode_points", []):
            point.update(roofline({**point, "decode_weight_bytes_read": row["decode_weight_bytes_read"]}, bandwidth))
        store.put(row)
        log(f"{tag}: {row['status']}" + (f" ({row['error']})" if row["status"] != "ok" else ""))
    manifest.update(complete=True, finished_at=_now())
    atomic_write_text(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=1))
    write_report(out_dir)
    return out_dir


def worker_main(argv: list[str]) -> int:
    """Entry point of a variant's own process: ``python -m quantlab.worker RECIPE.json INDEX OUT.json``."""
    spec_path, index, out_path = Path(argv[0]), int(argv[1]), Path(argv[2])
    recipe = validate_recipe(json.loads(spec_path.read_text()), str(spec_path))
    row = measure_variant_safely(recipe, recipe.variants()[index])
    atomic_write_text(out_path, json.dumps(row))
    return 0
