"""Claims: which process is measuring which variant of a shared run folder.

A claim is a file ``claims/<variant_key>.<generation>.json`` made by exclusive create (``O_CREAT|O_EXCL``,
atomic on local file systems and on NFSv3+), holding its owner (host, machine id, pid and the pid's start
time) and kept alive by a heartbeat: the owner touches the file every ``heartbeat_s``. The live claim of a
variant is its highest generation. A claim is stale when its owner is on this machine and no longer runs,
or when its heartbeat is older than ``stale_after_s`` (an owner on another machine that died or lost the
folder). Taking over a stale claim is the exclusive create of the next generation, so of two processes that
find the same stale claim exactly one wins. The owner removes its claim when its record is written.
"""
from __future__ import annotations

import json
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fingerprint import machine_id

HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0  # 12 missed heartbeats; also absorbs clock skew between machines sharing a folder


def _pid_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a live pid from a reused one), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    if start_ticks is None:
        return True
    now = _pid_start_ticks(pid)
    return now is None or now == start_ticks


def owner() -> dict[str, Any]:
    """This process, as a claim or a record names it."""
    return {"host": platform.node(), "machine_id": machine_id()[0], "pid": os.getpid(),
            "pid_start_ticks": _pid_start_ticks(os.getpid())}


def owner_alive(who: dict[str, Any]) -> bool | None:
    """True or False for an owner on this machine; None (cannot tell) for another machine's."""
    if who.get("machine_id") != machine_id()[0]:
        return None
    return pid_alive(int(who["pid"]), who.get("pid_start_ticks"))


@dataclass
class Claim:
    path: Path
    key: str
    generation: int
    owner: dict[str, Any]

    @property
    def age_s(self) -> float:
        try:
            return time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return float("inf")

    def stale(self, stale_after_s: float = STALE_AFTER_S) -> bool:
        alive = owner_alive(self.owner)
        if alive is False:
            return True
        return self.age_s > stale_after_s

    def describe(self) -> str:
        return f"pid {self.owner.get('pid')} on {self.owner.get('host')}"


class Claims:
    """The claims of one run folder."""

    def __init__(self, folder: Path, stale_after_s: float = STALE_AFTER_S) -> None:
        self.dir = Path(folder) / "claims"
        self.stale_after_s = stale_after_s

    def _generations(self, key: str) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        out = []
        for p in self.dir.glob(f"{key}.*.json"):
            gen = p.name[len(key) + 1: -len(".json")]
            if gen.isdigit():
                out.append((int(gen), p))
        return sorted(out)

    def current(self, key: str) -> Claim | None:
        """The live-or-stale claim of ``key`` with the highest generation, or None.

        A file that vanishes between the listing and the read was released, or a newer generation's owner removed
        it after creating its own: the listing is taken again rather than falling back to an older generation
        (which a taker-over may already have deleted, leaving nothing and inviting a second claim)."""
        for _ in range(100):
            found = self._generations(key)
            if not found:
                return None
            gen, path = found[-1]
            try:
                data = json.loads(path.read_text())
            except FileNotFoundError:
                continue  # released or superseded meanwhile: list again
            except json.JSONDecodeError:  # being written this instant: an exclusive create is never half-done for long
                data = {"owner": {}}
            return Claim(path, key, gen, data.get("owner") or {})
        return None

    def try_claim(self, key: str) -> Claim | None:
        """Claim ``key`` for this process. Returns our claim, or None when another live process holds it."""
        current = self.current(key)
        if current is not None and not current.stale(self.stale_after_s):
            return None
        generation = current.generation + 1 if current is not None else 0
        me = owner()
        path = self.dir / f"{key}.{generation}.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None  # another process claimed (or took over) this very generation first
        with os.fdopen(fd, "w") as f:
            json.dump({"owner": me, "claimed_at": time.time(),
                       "took_over": current.owner if current is not None else None}, f)
        newest = self.current(key)
        if newest is not None and newest.generation > generation:  # another process took a later generation
            path.unlink(missing_ok=True)
            return None
        for gen, old in self._generations(key):  # the stale generations below ours are dead owners' files
            if gen < generation:
                old.unlink(missing_ok=True)
        return Claim(path, key, generation, me)

    def release(self, claim: Claim) -> None:
        claim.path.unlink(missing_ok=True)


class Heartbeat:
    """Touches a claim file every ``interval_s`` in a daemon thread while a variant is measured."""

    def __init__(self, claim: Claim, interval_s: float = HEARTBEAT_S) -> None:
        self.claim, self.interval_s = claim, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{claim.key}", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                os.utime(self.claim.path)
            except FileNotFoundError:
                return

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> "Heartbeat":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
