"""Run a recipe: claim each variant, load, quantize and measure it (in its own process by default), write its
record, and rebuild the views. Any number of runs of one recipe can fill one folder together."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .claims import Claim, Claims, Heartbeat, owner
from .environment import environment
from .errors import QuantlabError, RecipeError, first_line
from .fingerprint import describe, fingerprint_id, machine_fingerprint
from .measure.bandwidth import BANDWIDTH_METHOD, copy_bandwidth_bytes_per_s
from .measure.device import describe_device, resolve_device
from .measurements import Measurement, VariantContext, all_measurements, enabled_measurements
from .measurements.context import config_estimate
from .models import load_config
from .progress import progress
from .recipe import ExecutorSpec, Recipe, Variant, validate_recipe
from .records import RECORD_VERSION, RunFolder, now_iso, reusable, wait_s
from .results import MANIFEST_FILE, atomic_write_text
from .views import flat_row

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _identity(recipe: Recipe, variant: Variant) -> dict[str, Any]:
    return {
        "record_version": RECORD_VERSION, "variant": variant.label, "variant_key": variant.key, "recipe": recipe.name,
        "model": recipe.model.label, "weight_format": variant.weight.label, "kv_format": variant.kv.label,
        "new_tokens": recipe.workload.new_tokens,
    }


def measure_variant(recipe: Recipe, variant: Variant, run_folder: Path | None = None) -> dict[str, Any]:
    """Load, quantize and run every enabled measurement of one variant in this process; returns the record's
    body (identity, measurements by name, decode points). ``run_folder`` holds run-wide intermediates."""
    device = resolve_device(recipe.device)
    body = {**_identity(recipe, variant), "device": describe_device(device), "started_at": now_iso()}
    start = time.perf_counter()
    ctx = VariantContext(recipe, variant, device, run_folder)
    ctx.load_and_quantize()
    measured = [(n, m) for n, m in enabled_measurements(recipe) if not m.derived]
    measurements: dict[str, Any] = {}
    points: list[dict[str, Any]] = []
    for name, m in measured:
        if m.scope == "variant":
            measurements.update(_results({name: m.measure(ctx)}))
        elif not points:  # the point measurements run together, at the first one's place in the order
            per_point = [(n, pm) for n, pm in measured if pm.scope == "point"]
            for b, p in progress(recipe.workload.points(), "decode points (batch, prompt)"):
                results = _results({n: pm.measure(ctx, (b, p)) for n, pm in per_point})
                points.append({"batch_size": b, "prompt_tokens": p, "measurements": results})
    body.update(status="ok", error=None, measurements=measurements, points=points,
                wall_s=round(time.perf_counter() - start, 3), environment=environment())
    return body


def _results(results: dict[str, Any]) -> dict[str, Any]:
    """Measurement results as record JSON, leaving out those that had nothing to report."""
    return {name: r.model_dump(mode="json") for name, r in results.items() if r is not None}


def _failed(recipe: Recipe, variant: Variant, error: str) -> dict[str, Any]:
    return {**_identity(recipe, variant), "status": "failed", "error": error, "measurements": {}, "points": []}


def measure_variant_safely(recipe: Recipe, variant: Variant, run_folder: Path | None = None) -> dict[str, Any]:
    """``measure_variant``, with any failure (out of memory, unsupported shape, ...) recorded as failed."""
    try:
        return measure_variant(recipe, variant, run_folder)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a failed variant is a result, not the end of the run
        first = first_line(e, default="")
        if not isinstance(e, QuantlabError):  # an unexpected failure: keep its traceback for the log
            traceback.print_exc(file=sys.stderr)
        return _failed(recipe, variant, f"{type(e).__name__}: {first}")


def _measure_in_subprocess(recipe: Recipe, index: int, run_folder: Path) -> dict[str, Any]:
    variant = recipe.variants()[index]
    with tempfile.TemporaryDirectory(prefix="quantlab-") as tmp:
        spec, out = Path(tmp) / "recipe.json", Path(tmp) / "record.json"
        spec.write_text(json.dumps(recipe.to_spec()))
        # On a terminal the worker's progress bars show through; otherwise its stderr is kept for the error line.
        stderr = None if sys.stderr.isatty() else subprocess.PIPE
        try:
            proc = subprocess.run([sys.executable, "-m", "quantlab.worker", str(spec), str(index), str(out),
                                   str(run_folder)],
                                  stdout=subprocess.DEVNULL, stderr=stderr, text=True, timeout=recipe.variant_timeout_s)
        except subprocess.TimeoutExpired:  # run() has killed the worker
            return _failed(recipe, variant, f"timed out after {recipe.variant_timeout_s:g} s (variant_timeout_s)")
        if out.is_file():
            return json.loads(out.read_text())
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        why = lines[-1] if lines else ("killed (out of memory?)" if proc.returncode in (-9, 137) else "see the log above")
        return _failed(recipe, variant, f"worker exited with code {proc.returncode}: {why}")


def position_limit(recipe: Recipe, config: Any) -> tuple[int | None, str]:
    """The model's position limit and where it comes from (the config field that states it)."""
    estimate = config_estimate(recipe.model)
    fact = estimate.architecture.row("position limit") if estimate else None
    if fact is not None and fact.value:
        return int(fact.value), f"{fact.kind} field {fact.source}" if fact.kind == "file" else f"{fact.kind}: {fact.source}"
    limit = getattr(config, "max_position_embeddings", None)
    return (int(limit), "config max_position_embeddings") if limit else (None, "")


def _check_lengths(recipe: Recipe, config: Any) -> None:
    """Refuse a workload, perplexity window or calibration length beyond the model's position limit."""
    limit, source = position_limit(recipe, config)
    if limit is None:
        return
    workload = recipe.workload
    prompt, new = max(p for _, p in workload.points()), workload.new_tokens
    if prompt + new > limit:
        raise RecipeError(recipe.source, "workload.prompt_tokens", f"{prompt} + new_tokens {new} = "
                          f"{prompt + new} positions exceed the model's position limit {limit} ({source})")
    ppl = recipe.evaluations.perplexity
    if ppl is not None and ppl.window_tokens > limit:
        raise RecipeError(recipe.source, "evaluations.perplexity.window_tokens",
                          f"{ppl.window_tokens} exceeds the model's position limit {limit} ({source})")
    if any(w.needs_calibration for w in recipe.weights) and recipe.calibration.seq_len > limit:
        raise RecipeError(recipe.source, "calibration.seq_len",
                          f"{recipe.calibration.seq_len} exceeds the model's position limit {limit} ({source})")


def _check_model(recipe: Recipe) -> None:
    """Fail before writing anything if the model cannot be found, a KV format does not fit it, or the workload
    asks for more positions than it has."""
    config = load_config(recipe.model)
    for i, kv in enumerate(recipe.kv_cache):
        problem = kv.check(config)
        if problem:
            raise RecipeError(recipe.source, f"kv_cache[{i}]", f"{kv.label}: {problem}")
    _check_lengths(recipe, config)


def _manifest(recipe: Recipe, sweep: int) -> dict[str, Any]:
    """The run's description; views add ``complete`` and the fingerprints their rows were measured under."""
    estimate = config_estimate(recipe.model)
    variants = recipe.variants()
    return {
        "recipe": recipe.to_spec(), "baseline": recipe.baseline_label, "variant_keys": [v.key for v in variants],
        "variants": [v.label for v in variants], "complete": False, "sweep": sweep,
        "measurements": [name for name, _ in enabled_measurements(recipe)],
        "model_evidence": [vars(e) for e in estimate.architecture.evidence] if estimate else [],
    }


def finish_record(body: dict[str, Any], sweep: int, bandwidth_before: float | None,
                  bandwidth_after: float | None) -> dict[str, Any]:
    """A variant's measured body as a record of this process: sweep, machine fingerprint, writer, and the copy
    bandwidth measured before and after it (a large change means the machine was busy; None: not measured)."""
    fingerprint = machine_fingerprint()

    def as_int(x: float | None) -> int | None:
        return None if x is None else int(x)

    return {**body, "sweep": sweep, "fingerprint": fingerprint, "fingerprint_id": fingerprint_id(fingerprint),
            "writer": owner(), "memory_bandwidth_bytes_per_s": as_int(bandwidth_before),
            "memory_bandwidth_after_bytes_per_s": as_int(bandwidth_after), "memory_bandwidth_method": BANDWIDTH_METHOD,
            "finished_at": now_iso()}


class Sweep:
    """This process's share of one sweep over the recipe's variants, measured here one at a time (in a process
    of its own per variant, or in this one). ``ray_executor.RaySweep`` runs the same loop on a Ray cluster."""

    def __init__(self, recipe: Recipe, folder: RunFolder, sweep: int, log: Log,
                 shard: tuple[int, int] | None = None, executor: ExecutorSpec | None = None) -> None:
        self.recipe, self.folder, self.sweep, self.log, self.shard = recipe, folder, sweep, log, shard
        self.executor = executor
        self.fid = fingerprint_id(machine_fingerprint())
        self.claims = Claims(folder.path)
        self.told: set[str] = set()
        self.bandwidth: float | None = None

    def _tell_once(self, key: str, msg: str) -> None:
        if key not in self.told:
            self.told.add(key)
            self.log(msg)

    def start(self, index: int, variant: Variant, claim: Claim, tag: str) -> None:
        """Measure a claimed variant, write its record and release the claim (here: synchronously)."""
        try:
            device = resolve_device(self.recipe.device)
            if self.bandwidth is None:
                self.bandwidth = copy_bandwidth_bytes_per_s(device)
                self.log(f"memory bandwidth (copy): {self.bandwidth / 1e9:.1f} GB/s")
            with Heartbeat(claim):
                body = (_measure_in_subprocess(self.recipe, index, self.folder.path) if self.recipe.isolation == "process"
                        else measure_variant_safely(self.recipe, variant, self.folder.path))
            self.record(tag, finish_record(body, self.sweep, self.bandwidth, copy_bandwidth_bytes_per_s(device)))
        finally:
            self.claims.release(claim)

    def drain(self) -> None:
        """Wait for variants started and not yet recorded (none here: ``start`` is synchronous)."""

    def record(self, tag: str, record: dict[str, Any]) -> None:
        self.folder.write_record(record)
        self.told.add(record["variant_key"])
        self.log(f"{tag}: {record['status']}" + (f" ({record['error']})" if record["status"] != "ok" else ""))
        row = flat_row(record)
        for line in sorted({a for _, m in all_measurements() for place in _places(row, m) if (a := m.alert(place))}):
            self.log(f"{tag}: {line}")

    def one_pass(self) -> dict[str, Any]:
        """Measure every variant nobody has measured or is measuring; returns the keys other live processes hold."""
        variants = self.recipe.variants()
        held: dict[str, Any] = {}
        try:
            for i, variant in enumerate(variants):
                if self.shard is not None and shard_of(variant.key, self.shard[1]) != self.shard[0]:
                    continue  # another shard's variant
                tag = f"[{i + 1}/{len(variants)}] {variant.label}"
                why = reusable(self.folder.read_record(variant.key), self.fid, self.sweep)
                if why:
                    self._tell_once(variant.key, f"{tag}: {why}")
                    continue
                claim = self.claims.try_claim(variant.key)
                if claim is None:
                    held[variant.key] = self.claims.current(variant.key)
                    continue
                why = reusable(self.folder.read_record(variant.key), self.fid, self.sweep)
                if why:  # finished by another process between our look and our claim
                    self.claims.release(claim)
                    self._tell_once(variant.key, f"{tag}: {why}")
                    continue
                self.log(f"{tag}: running")
                self.start(i, variant, claim, tag)
        finally:
            self.drain()
        return held

    def all_recorded(self) -> bool:
        """Whether every variant of the recipe (every shard's) has a record that stands for it in this sweep."""
        return all(reusable(self.folder.read_record(v.key), self.fid, self.sweep) for v in self.recipe.variants())

    def run(self) -> None:
        attempt = 0
        while True:
            held = self.one_pass()
            if not held:
                return
            if attempt == 0:
                who = sorted({c.describe() for c in held.values() if c is not None})
                self.log(f"waiting for {len(held)} variant(s) being measured by other processes ({', '.join(who)})")
            time.sleep(wait_s(attempt))
            attempt += 1


def _places(row: dict[str, Any], m: Measurement) -> list[dict[str, Any]]:
    """Where a measurement's figures are in a flat row: its decode points (point scope) or the row itself."""
    return (row.get("decode_points") or []) if m.scope == "point" else [row]


def shard_of(variant_key: str, shards: int) -> int:
    """The shard a variant belongs to: its key (a hash of its resolved config) modulo the shard count, the same
    in every process and on every machine."""
    return int(variant_key, 16) % shards


def run_recipe(recipe: Recipe, out_dir: Path | None = None, *, log: Log = _stderr,
               shard: tuple[int, int] | None = None, executor: ExecutorSpec | None = None) -> Path:
    """Measure every variant of ``recipe`` that ``out_dir`` has no usable record of (sharing the work with any
    other process running into the same folder), then rebuild the views. Returns ``out_dir``.

    ``shard=(i, n)``: only the variants whose key falls in shard ``i`` of ``n`` (array jobs: ``n`` such runs,
    anywhere, into one shared folder measure every variant once; ``quantlab report`` then builds the report).
    ``executor``: where the variants run (default: the recipe's ``executor``, local unless it says ray)."""
    from .report import write_report

    out_dir = Path(out_dir or Path("reports") / recipe.name)
    executor = executor or recipe.executor
    sweep_class = executor.sweep_class()  # a missing engine (Ray) is an error before anything is written
    _check_model(recipe)
    folder = RunFolder(out_dir)
    folder.check_writable()
    folder.convert_legacy(log)
    sweep, started = folder.join_or_start_sweep()
    log(f"{'started' if started else 'joined'} sweep {sweep} in {out_dir} on {describe(machine_fingerprint())}")
    atomic_write_text(out_dir / MANIFEST_FILE, json.dumps(_manifest(recipe, sweep), indent=1))
    share = sweep_class(recipe, folder, sweep, log, shard, executor)
    share.run()
    if share.all_recorded():
        folder.complete_sweep(sweep)
    else:
        log(f"shard {shard[0]}/{shard[1]} done; other shards' variants are still missing (quantlab report {out_dir} "
            "once every shard has finished)" if shard else "some variants are still missing")
    if folder.has_records():
        write_report(out_dir, log=log)
    return out_dir


def worker_main(argv: list[str]) -> int:
    """Entry point of a variant's own process: ``python -m quantlab.worker RECIPE.json INDEX OUT.json [RUN_FOLDER]``."""
    spec_path, index, out_path = Path(argv[0]), int(argv[1]), Path(argv[2])
    run_folder = Path(argv[3]) if len(argv) > 3 else None
    recipe = validate_recipe(json.loads(spec_path.read_text()), str(spec_path))
    body = measure_variant_safely(recipe, recipe.variants()[index], run_folder)
    atomic_write_text(out_path, json.dumps(body))
    return 0
