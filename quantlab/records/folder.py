"""A run folder: one record per variant, claims, sweeps, and the conversion of older results.jsonl folders.

Layout (any number of processes, on one machine or many sharing the folder, fill it together)::

    records/<variant_key>.json          one finished variant (ok or failed), written atomically
    records/replaced/<key>.<n>.json     a record some later measurement replaced (a retried failure, or a row
                                        measured again on another machine); never deleted
    claims/<variant_key>.<gen>.json     the process measuring that variant now (see ``claims``)
    sweeps/<n>.json                     one pass over the recipe's variants; ``<n>.complete`` once every
                                        variant has a record
    manifest.json, results.jsonl, results.csv, results.parquet, report.md, report.html
                                        views, rebuilt from the records

A record is reused (the variant is not measured again) when its variant key (a hash of the resolved
variant config) matches and it was measured under this machine's fingerprint, or when another process
wrote it during the sweep this process joined (it is that sweep's share of the work). A failed record is
retried by the next sweep, or in the same sweep once its writer on this machine has exited.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..errors import QuantlabError
from ..files import MANIFEST_FILE, RESULTS_FILE, atomic_write_text, read_jsonl
from .claims import owner, owner_alive

RECORD_VERSION = 2
Log = Callable[[str], None]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunFolder:
    """The records, sweeps and claims under one output folder."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.records_dir = self.path / "records"
        self.replaced_dir = self.records_dir / "replaced"
        self.sweeps_dir = self.path / "sweeps"

    # -- checks ---------------------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Refuse, before anything is measured, a path that is a file or a folder this process cannot write."""
        if self.path.exists() and not self.path.is_dir():
            raise QuantlabError(f"{self.path}: --out is an existing file, not a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise QuantlabError(f"{self.path}: cannot write the output folder ({e.strerror or type(e).__name__})") from None

    # -- records ----------------------------------------------------------------------------------------------
    def record_path(self, key: str) -> Path:
        return self.records_dir / f"{key}.json"

    def read_record(self, key: str) -> dict[str, Any] | None:
        return self._read(self.record_path(key))

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise QuantlabError(f"{path}: not a valid record (line {e.lineno}: {e.msg}); delete it to measure "
                                "that variant again") from None

    def records(self) -> dict[str, dict[str, Any]]:
        """Every record in the folder, by variant key."""
        if not self.records_dir.is_dir():
            return {}
        out = {}
        for p in sorted(self.records_dir.glob("*.json")):
            rec = self._read(p)
            if rec is not None:
                out[p.stem] = rec
        return out

    def has_records(self) -> bool:
        return self.records_dir.is_dir() and any(self.records_dir.glob("*.json"))

    def write_record(self, record: dict[str, Any]) -> Path:
        """Write one variant's record atomically; a record it replaces moves to ``records/replaced/``."""
        path = self.record_path(record["variant_key"])
        if path.exists():
            self.replaced_dir.mkdir(parents=True, exist_ok=True)
            n = len(list(self.replaced_dir.glob(f"{record['variant_key']}.*.json")))
            try:
                os.replace(path, self.replaced_dir / f"{record['variant_key']}.{n}.json")
            except FileNotFoundError:
                pass
        atomic_write_text(path, json.dumps(record, indent=1))
        return path

    # -- sweeps -----------------------------------------------------------------------------------------------
    def _sweeps(self) -> list[int]:
        if not self.sweeps_dir.is_dir():
            return []
        return sorted(int(p.stem) for p in self.sweeps_dir.glob("*.json") if p.stem.isdigit())

    def sweep_complete(self, n: int) -> bool:
        return (self.sweeps_dir / f"{n}.complete").exists()

    def join_or_start_sweep(self) -> tuple[int, bool]:
        """(sweep number, whether this process started it): the current sweep if it is still open (another
        process is filling it, or it was interrupted), else a new one made by exclusive create."""
        while True:
            sweeps = self._sweeps()
            if sweeps and not self.sweep_complete(sweeps[-1]):
                return sweeps[-1], False
            n = sweeps[-1] + 1 if sweeps else 0
            self.sweeps_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.sweeps_dir / f"{n}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue  # another process started it first: join that one
            with os.fdopen(fd, "w") as f:
                json.dump({"started_at": now_iso(), "started_by": owner()}, f)
            return n, True

    def complete_sweep(self, n: int) -> None:
        marker = self.sweeps_dir / f"{n}.complete"
        if not marker.exists():
            atomic_write_text(marker, now_iso() + "\n")

    # -- older folders ----------------------------------------------------------------------------------------
    def convert_legacy(self, log: Log) -> int:
        """A folder written before per-variant records (results.jsonl only) is read once and converted."""
        legacy = self.path / RESULTS_FILE
        if self.records_dir.is_dir() or not legacy.is_file():
            return 0
        from .views import record_from_flat_row

        rows = read_jsonl(legacy, log=log)
        for row in rows:
            self.write_record(record_from_flat_row(row))
        manifest_path = self.path / MANIFEST_FILE
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        keys = [r["variant_key"] for r in rows]
        if rows and not set(keys) <= set(manifest.get("variant_keys") or []):
            # every row of an older results.jsonl belonged to its last run: report them all, in the file's order
            manifest.update(variant_keys=keys, variants=[r["variant"] for r in rows])
            manifest.setdefault("baseline", rows[0]["variant"])
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
        if rows:
            log(f"{legacy}: converted {len(rows)} rows to per-variant records in {self.records_dir}")
        return len(rows)


def reusable(record: dict[str, Any] | None, fingerprint_id: str, sweep: int) -> str | None:
    """Why ``record`` stands for its variant in this sweep (a log phrase), or None if it must be measured."""
    if record is None:
        return None
    same_machine = record.get("fingerprint_id") == fingerprint_id
    this_sweep = record.get("sweep") == sweep
    if record.get("status") == "ok":
        if same_machine:
            return "already measured, skipped"
        if this_sweep:
            return f"measured in this sweep by {record.get('writer', {}).get('host', 'another machine')}, skipped"
        return None
    if this_sweep and owner_alive(record.get("writer") or {}) is not False:
        return "failed in this sweep (retried by the next run), skipped"
    return None


def wait_s(attempt: int) -> float:
    """Polling interval while other processes hold claims: short at first, then every few seconds."""
    return min(5.0, 0.5 * (attempt + 1))
