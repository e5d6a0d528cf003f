"""Measuring one variant, the same function wherever it runs (this process, a worker process, a Ray task):
load, quantize, run every enabled measurement, and wrap the result as a record of the process that measured it."""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ..engine.bandwidth import BANDWIDTH_METHOD
from ..engine.device import describe_device, resolve_device
from ..environment import environment
from ..errors import QuantlabError, first_line
from ..measurements import enabled_measurements
from ..progress import progress
from ..records.claims import owner
from ..records.fingerprint import fingerprint_id, machine_fingerprint
from ..records.folder import RECORD_VERSION, now_iso
from .lifecycle import VariantContext
from .recipe import Recipe, Variant


def _identity(recipe: Recipe, variant: Variant) -> dict[str, Any]:
    return {
        "record_version": RECORD_VERSION, "variant": variant.label, "variant_key": variant.key, "recipe": recipe.name,
        "model": recipe.model.label, "weight_format": variant.weight.label, "kv_format": variant.kv.label,
        "new_tokens": recipe.workload.new_tokens,
    }


def measure_variant(recipe: Recipe, variant: Variant, run_folder: Path | None = None,
                    retime: bool = False) -> dict[str, Any]:
    """Load, quantize and run every enabled measurement of one variant in this process (with the recipe's
    threads); returns the record's body (identity, measurements by name, decode points). ``run_folder`` holds
    run-wide intermediates. ``retime``: measure only the decode points again, keeping every other figure of the
    variant's record in ``run_folder`` (its quality was not in question, its timing was)."""
    kept = _kept_record(run_folder, variant) if retime else None
    with recipe.threads_applied():
        return _measure_variant(recipe, variant, run_folder, kept)


def _kept_record(run_folder: Path | None, variant: Variant) -> dict[str, Any] | None:
    """The measured record whose variant-scope figures a re-timing keeps (None: measure everything)."""
    from ..records.folder import RunFolder

    record = RunFolder(run_folder).read_record(variant.key) if run_folder is not None else None
    return record if record is not None and record.get("status") == "ok" else None


def _measure_variant(recipe: Recipe, variant: Variant, run_folder: Path | None,
                     kept: dict[str, Any] | None = None) -> dict[str, Any]:
    device = resolve_device(recipe.device)
    body = {**_identity(recipe, variant), "device": describe_device(device), "started_at": now_iso()}
    start = time.perf_counter()
    ctx = VariantContext(recipe, variant, device, run_folder)
    ctx.load_and_quantize()
    measured = [(n, m) for n, m in enabled_measurements(recipe) if not m.derived]
    measurements: dict[str, Any] = dict(kept["measurements"]) if kept else {}
    points: list[dict[str, Any]] = []
    try:
        for name, m in measured:
            if m.scope == "variant" and kept is None:
                measurements.update(_results({name: m.measure(ctx)}))
            elif not points:  # the point measurements run together, at the first one's place in the order
                per_point = [(n, pm) for n, pm in measured if pm.scope == "point"]
                for b, p in progress(recipe.workload.points(), "decode points (batch, prompt)"):
                    results = _results({n: pm.measure(ctx, (b, p)) for n, pm in per_point})
                    points.append({"batch_size": b, "prompt_tokens": p, "measurements": results})
    finally:
        ctx.close()
    body.update(status="ok", error=None, measurements=measurements, points=points,
                wall_s=round(time.perf_counter() - start, 3), environment=environment())
    if kept is not None:  # the quality figures and exports stand as first measured; only the timing is new
        body["retimed"] = {"first_started_at": kept.get("started_at"), "first_sweep": kept.get("sweep")}
        if kept.get("exports"):
            body["exports"] = kept["exports"]
        return body
    targets = recipe.exports_for(variant)
    if targets:
        from .export import export_measured

        body["exports"] = export_measured(ctx, targets)
    return body


def _results(results: dict[str, Any]) -> dict[str, Any]:
    """Measurement results as record JSON, leaving out those that had nothing to report."""
    return {name: r.model_dump(mode="json") for name, r in results.items() if r is not None}


def failed_record(recipe: Recipe, variant: Variant, error: str) -> dict[str, Any]:
    """The record body of a variant that could not be measured (retried by the next run)."""
    return {**_identity(recipe, variant), "status": "failed", "error": error, "measurements": {}, "points": []}


def measure_variant_safely(recipe: Recipe, variant: Variant, run_folder: Path | None = None,
                           retime: bool = False) -> dict[str, Any]:
    """``measure_variant``, with any failure (out of memory, unsupported shape, ...) recorded as failed."""
    try:
        return measure_variant(recipe, variant, run_folder, retime)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a failed variant is a result, not the end of the run
        first = first_line(e, default="")
        if not isinstance(e, QuantlabError):  # an unexpected failure: keep its traceback for the log
            traceback.print_exc(file=sys.stderr)
        return failed_record(recipe, variant, f"{type(e).__name__}: {first}")


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
