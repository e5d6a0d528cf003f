"""Timing variants again together (``quantlab run --retime all --rounds N``): every chosen variant loaded and made
ready in this process, then at each decode point N rounds in which each variant in turn runs a short warm-up and
one timed generation, the order rotating from round to round. A machine that drifts over minutes then slows every
variant alike instead of whichever ran in its slow minutes, and the ratios between rows hold.

Only the figures of timing measurements (``Measurement.timing_only``: the decode steps) are replaced; a record's
quality figures, exports and memory peaks stand as measured with the variant alone in its process (other variants
held beside it would inflate a process-wide peak)."""
from __future__ import annotations

import contextlib
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from ..engine import DecodeResult
from ..engine.bandwidth import copy_bandwidth_bytes_per_s
from ..engine.device import describe_device, resolve_device
from ..environment import environment
from ..errors import QuantlabError, first_line
from ..measurements import enabled_measurements
from ..records.claims import Claims, Heartbeat
from ..records.folder import RunFolder, now_iso
from .lifecycle import VariantContext
from .recipe import Recipe, Variant
from .sweep import Retime, to_time_again
from .variant import finish_record

Log = Callable[[str], None]
MEMORY_SHARE = 0.8  # of the memory available now that the variants' weights, and one model's load beside them, may take


def chosen(recipe: Recipe, folder: RunFolder, which: Retime) -> list[tuple[Variant, dict[str, Any]]]:
    """The recipe's variants whose measured records ``--retime which`` times again, with those records (any sweep's:
    the pass times them together, those just measured too)."""
    out = []
    for variant in recipe.variants():
        record = folder.read_record(variant.key)
        if record is not None and to_time_again(record, -1, which):
            out.append((variant, record))
    return out


def available_memory_bytes() -> int | None:
    """The memory the kernel says new work can take without swapping (Linux's MemAvailable), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def weight_bytes(record: dict[str, Any]) -> int:
    """The bytes of a measured record's weights (0 when it has none recorded)."""
    return (record.get("measurements", {}).get("weights") or {}).get("weight_bytes") or 0


def check_memory(records: list[dict[str, Any]], largest_bytes: int, rounds: int,
                 available: int | None) -> None:
    """Refuse, before loading anything, variants whose weights together (and one unquantized load beside them)
    would not fit in the memory available."""
    if available is None:
        return
    held = sum(weight_bytes(r) for r in records)
    need = held + largest_bytes
    if need > MEMORY_SHARE * available:
        raise QuantlabError(f"--rounds {rounds}: the {len(records)} variants to time together hold "
                            f"{held / 2**30:.2f} GiB of weights (and a model's load beside them, "
                            f"{largest_bytes / 2**30:.2f} GiB), more than {MEMORY_SHARE:.0%} of the "
                            f"{available / 2**30:.2f} GiB available here; time them alone (--rounds 1)")


def retime_interleaved(recipe: Recipe, folder: RunFolder, sweep: int, log: Log, which: Retime,
                       rounds: int) -> list[str]:
    """Time the decode points of the variants ``which`` names again, ``rounds`` rounds interleaved in this process,
    and write their records (timing replaced, the rest kept). Returns the labels timed again; a variant that cannot
    be loaded or timed keeps its earlier record and the others go on."""
    todo = chosen(recipe, folder, which)
    if not todo:
        log("no measured variant to time again")
        return []
    everything = [r for r in folder.records().values() if r.get("status") == "ok"]
    largest = max(map(weight_bytes, everything), default=0)
    check_memory([r for _, r in todo], largest, rounds, available_memory_bytes())
    device = resolve_device(recipe.device)
    claims = Claims(folder.path)
    with contextlib.ExitStack() as stack:
        contexts: dict[str, tuple[VariantContext, dict[str, Any]]] = {}
        for variant, record in todo:
            claim = claims.try_claim(variant.key)
            if claim is None:
                log(f"{variant.label}: being measured by another process; not timed again here")
                continue
            stack.callback(claims.release, claim)
            stack.enter_context(Heartbeat(claim))
            ctx = VariantContext(recipe, variant, device, folder.path)
            log(f"{variant.label}: loading to time together with the others")
            if _safely(log, variant.label, "could not be loaded", ctx.load_and_quantize) is _FAILED:
                continue
            stack.callback(ctx.close)
            contexts[variant.key] = (ctx, record)
        started, before = now_iso(), copy_bandwidth_bytes_per_s(device)
        for point in recipe.workload.points():
            _time_point(contexts, point, rounds, log)
        after = copy_bandwidth_bytes_per_s(device)
        labels = [ctx.variant.label for ctx, _ in contexts.values()]
        for ctx, record in contexts.values():
            body = _retimed(record, ctx, started, rounds, labels)
            folder.write_record(finish_record(body, sweep, before, after))
            log(f"{ctx.variant.label}: timed again, {rounds} rounds interleaved with {len(labels) - 1} other variant(s)")
    return labels


_FAILED = object()


def _safely(log: Log, label: str, what: str, call: Callable[[], Any]) -> Any:
    """``call()``, or ``_FAILED`` with a line in the log (a traceback too where the failure is not a user's)."""
    try:
        return call()
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - one variant failing leaves the others' timing standing
        if not isinstance(e, QuantlabError):
            traceback.print_exc(file=sys.stderr)
        log(f"{label}: {what} ({type(e).__name__}: {first_line(e, default='')}); its earlier timing stays")
        return _FAILED


def _time_point(contexts: dict[str, tuple[VariantContext, dict[str, Any]]], point: tuple[int, int], rounds: int,
                log: Log) -> None:
    """Every variant's engine made ready at ``point``, then ``rounds`` rounds in rotating order; each variant's
    rounds pooled into the generation its point measurements read. A variant that fails here is dropped."""
    with contextlib.ExitStack() as engines:
        timers: dict[str, Callable[[], DecodeResult]] = {}
        for key, (ctx, _) in list(contexts.items()):
            timer = _safely(log, ctx.variant.label, f"could not be made ready at {point}",
                            lambda: engines.enter_context(ctx.decode_rounds(*point)))
            if timer is _FAILED:
                contexts.pop(key)
            else:
                timers[key] = timer
        results: dict[str, list[DecodeResult]] = {key: [] for key in timers}
        order = list(timers)
        for r in range(rounds):
            if not order:
                break
            log(f"decode point {point}: round {r + 1}/{rounds} over {len(order)} variants")
            turn = r % len(order)
            for key in order[turn:] + order[:turn]:
                got = _safely(log, contexts[key][0].variant.label, f"failed in round {r + 1}", timers[key])
                if got is _FAILED:
                    contexts.pop(key)
                    order.remove(key)
                else:
                    results[key].append(got)
        for key in order:
            contexts[key][0].set_generation(*point, DecodeResult.pooled(results[key], len(order)))


def _retimed(record: dict[str, Any], ctx: VariantContext, started: str, rounds: int,
             labels: list[str]) -> dict[str, Any]:
    """The record's body with its timing measurements at each point measured again from the pooled rounds."""
    timing = [(n, m) for n, m in enabled_measurements(ctx.recipe) if m.scope == "point" and m.timing_only]
    timed = set(ctx.recipe.workload.points())  # a variant that got here was timed at every one
    points = []
    for p in record.get("points") or []:
        point = (p["batch_size"], p["prompt_tokens"])
        results = dict(p.get("measurements") or {})
        if point in timed:
            for name, m in timing:
                got = m.measure(ctx, point)
                if got is not None:
                    results[name] = got.model_dump(mode="json")
        points.append({**p, "measurements": results})
    earlier = record.get("retimed") or {}
    # the sweep, fingerprint, writer, bandwidths and finish time are this process's: finish_record sets them
    return {**record, "points": points, "started_at": started,
            "device": describe_device(ctx.device), "environment": environment(),
            "retimed": {"first_started_at": earlier.get("first_started_at") or record.get("started_at"),
                        "first_sweep": earlier.get("first_sweep") or record.get("sweep"),
                        "interleaved": {"rounds": rounds, "variants": labels}}}
