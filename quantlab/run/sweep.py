"""A sweep: one process's share of a pass over a recipe's variants, each claimed in the run folder, measured and
recorded. ``Sweep`` measures here, one variant at a time (the ``local`` executor); other executors subclass it."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Literal

from ..engine.bandwidth import copy_bandwidth_bytes_per_s
from ..engine.device import resolve_device
from ..measurements import Measurement, all_measurements
from ..progress import LINE_PREFIX
from ..records.claims import Claim, Claims, Heartbeat
from ..records.fingerprint import fingerprint_id, machine_fingerprint
from ..records.folder import RunFolder, reusable, wait_s
from ..records.views import flat_row
from .recipe import ExecutorSpec, Recipe, Variant
from .variant import failed_record, finish_record, measure_variant_safely

Log = Callable[[str], None]


# A variant's process: Ctrl-C (SIGINT to the terminal's whole process group) ends it at once with status 130 and no
# traceback, from its first line on (before quantlab is imported); the run that started it says the rest.
Retime = Literal["noisy", "all"]  # which earlier records ``--retime`` times again (the CLI's choices)

WORKER = ("import os, signal, sys; signal.signal(signal.SIGINT, lambda *_: os._exit(130)); "
          "from quantlab.run.worker import main; sys.exit(main(sys.argv[1:]))")


def measure_in_subprocess(recipe: Recipe, index: int, run_folder: Path, log: Log | None = None,
                          retime: bool = False) -> dict[str, Any]:
    """The variant measured in a fresh worker process (``isolation: process``); a crash or time-out is a failed
    record. Off a terminal the worker's stderr is read as it comes: its progress lines go to ``log`` and its last
    lines are kept for the error (on a terminal its progress bars show through). A terminal's Ctrl-C reaches the
    worker too: it leaves at once and silently (``WORKER``), and this process reports the interruption once."""
    variant = recipe.variants()[index]
    with tempfile.TemporaryDirectory(prefix="quantlab-") as tmp:
        spec, out = Path(tmp) / "recipe.json", Path(tmp) / "record.json"
        spec.write_text(json.dumps(recipe.to_spec()))
        piped = not sys.stderr.isatty()
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(spec), str(index), str(out),
                                 str(run_folder), *(["--retime"] if retime else [])], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE if piped else None, text=True)
        tail: deque[str] = deque(maxlen=20)
        reader = threading.Thread(target=_read_stderr, args=(proc, tail, log), daemon=True) if piped else None
        if reader is not None:
            reader.start()
        try:
            proc.wait(timeout=recipe.variant_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return failed_record(recipe, variant, f"timed out after {recipe.variant_timeout_s:g} s (variant_timeout_s)")
        except BaseException:  # interrupted: the worker goes with this process
            proc.kill()
            raise
        finally:
            if reader is not None:
                reader.join(timeout=10)
        if out.is_file():
            return json.loads(out.read_text())
        lines = [ln for ln in tail if ln.strip()]
        why = lines[-1] if lines else ("killed (out of memory?)" if proc.returncode in (-9, 137) else "see the log above")
        return failed_record(recipe, variant, f"worker exited with code {proc.returncode}: {why}")


def _read_stderr(proc: subprocess.Popen, tail: "deque[str]", log: Log | None) -> None:
    """Forward a worker's progress lines to ``log``; keep its other last lines in ``tail``."""
    assert proc.stderr is not None
    for line in proc.stderr:
        line = line.rstrip("\n")
        if line.startswith(LINE_PREFIX) and log is not None:
            log(line.removeprefix("quantlab: "))
        else:
            tail.append(line)


class Sweep:
    """This process's share of one sweep over the recipe's variants, measured here one at a time (in a process
    of its own per variant, or in this one): the ``local`` executor. ``ray_executor.RaySweep`` runs the same loop
    on a Ray cluster."""

    @classmethod
    def check_available(cls, executor: ExecutorSpec) -> None:
        """Raise a one-line ``QuantlabError`` when this executor cannot run here as ``executor`` asks (a missing
        optional engine), before anything is written."""

    def __init__(self, recipe: Recipe, folder: RunFolder, sweep: int, log: Log,
                 shard: tuple[int, int] | None = None, executor: ExecutorSpec | None = None,
                 retime: Retime | bool | None = None, keep_measured: bool | None = None) -> None:
        self.recipe, self.folder, self.sweep, self.log, self.shard = recipe, folder, sweep, log, shard
        self.executor = executor
        # measure again the decode points of earlier records: those flagged noisy, or all of them (None: none)
        self.retime = which_retime(retime)
        # a measured record of another machine stands instead of being measured again (default: when re-timing,
        # which is about the timing; the quality figures do not depend on the machine that took them)
        self.keep_measured = bool(self.retime) if keep_measured is None else keep_measured
        self.retiming: set[str] = set()
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
            before = copy_bandwidth_bytes_per_s(device)  # just before this variant: its after is compared with it
            if self.bandwidth is None:
                self.bandwidth = before
                self.log(f"memory bandwidth (copy): {before / 1e9:.1f} GB/s")
            retime = variant.key in self.retiming
            with Heartbeat(claim):
                body = (measure_in_subprocess(self.recipe, index, self.folder.path, self.log, retime)
                        if self.recipe.isolation == "process"
                        else measure_variant_safely(self.recipe, variant, self.folder.path, retime))
            self.record(tag, finish_record(body, self.sweep, before, copy_bandwidth_bytes_per_s(device)))
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
                record = self.folder.read_record(variant.key)
                why = self.stands(record)
                if why and self.retime and to_time_again(record, self.sweep, self.retime):
                    why = None
                    self.retiming.add(variant.key)
                if why:
                    self._tell_once(variant.key, f"{tag}: {why}")
                    continue
                solver = self.solving_elsewhere(variant)
                if solver is not None:  # its weights are being solved for a twin: wait for them, do not solve again
                    held[variant.key] = solver
                    self._tell_once(f"solve:{variant.key}", f"{tag}: waiting for {solver.describe()}, which is "
                                    f"solving the same weights ({variant.weight.label}) for this run")
                    continue
                claim = self.claims.try_claim(variant.key)
                if claim is None:
                    held[variant.key] = self.claims.current(variant.key)
                    continue
                record = self.folder.read_record(variant.key)
                why = self.stands(record)
                if why and variant.key in self.retiming and to_time_again(record, self.sweep, self.retime):
                    why = None
                if why:  # finished by another process between our look and our claim
                    self.claims.release(claim)
                    self._tell_once(variant.key, f"{tag}: {why}")
                    continue
                again = "timing again (flagged noisy)" if self.retime == "noisy" else "timing again"
                self.log(f"{tag}: " + (again if variant.key in self.retiming else "running"))
                self.start(i, variant, claim, tag)
        finally:
            self.drain()
        return held

    def solving_elsewhere(self, variant: Variant) -> Claim | None:
        """The live claim of another variant with the same calibrated weights while those weights are not yet kept
        in the run folder: it is solving them, and ``variant`` will load them instead of solving its own."""
        from .lifecycle import shared_weights_path

        device = resolve_device(self.recipe.device)
        path = shared_weights_path(self.recipe, variant, device, self.folder.path)
        if path is None or path.is_file():
            return None
        for twin in self.recipe.variants():
            if twin.key == variant.key or twin.weight != variant.weight:
                continue
            claim = self.claims.current(twin.key)
            if claim is not None and not claim.stale(self.claims.stale_after_s):
                return claim
        return None

    def stands(self, record: dict[str, Any] | None) -> str | None:
        """Why ``record`` stands for its variant in this sweep (a log phrase), or None if it must be measured."""
        why = reusable(record, self.fid, self.sweep)
        if why is None and self.keep_measured and record is not None and record.get("status") == "ok":
            host = (record.get("fingerprint") or {}).get("host") or "another machine"
            return f"measured on {host}, kept (its timing is what a re-timing measures)"
        return why

    def all_recorded(self) -> bool:
        """Whether every variant of the recipe (every shard's) has a record that stands for it in this sweep."""
        return all(self.stands(self.folder.read_record(v.key)) for v in self.recipe.variants())

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


def which_retime(retime: Retime | bool | None) -> Retime | None:
    """``--retime``'s choice: True (the bare flag) is ``noisy``; None or False, no re-timing."""
    return "noisy" if retime is True else (retime or None)


def noisy_earlier(record: dict[str, Any] | None, sweep: int) -> bool:
    """Whether a measured record of an earlier sweep has a decode point timed on a noisy machine (``--retime``)."""
    return to_time_again(record, sweep, "noisy")


def to_time_again(record: dict[str, Any] | None, sweep: int, which: Retime) -> bool:
    """Whether ``--retime which`` times a measured record of an earlier sweep again: ``noisy``, where a decode point
    was timed on a noisy machine; ``all``, where it has decode points at all (after the engine or its kernels
    changed). A record of this sweep is never timed twice."""
    if record is None or record.get("status") != "ok" or record.get("sweep") == sweep:
        return False
    points = flat_row(record).get("decode_points") or []
    return any(p.get("noisy") for p in points) if which == "noisy" else bool(points)


def shard_of(variant_key: str, shards: int) -> int:
    """The shard a variant belongs to: its key (a hash of its resolved config) modulo the shard count, the same
    in every process and on every machine."""
    return int(variant_key, 16) % shards
