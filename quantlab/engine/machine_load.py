"""What else the machine was doing while a step was timed: the load average, the CPU share this process got
for its threads, and other quantlab processes timing on the same host at the same time."""
from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch


@dataclass
class MachineLoad:
    threads: int  # torch's CPU threads
    load_average_1m: float | None  # the host's 1-minute load average when the timed section ended
    process_cpu_share: float  # CPU time this process used / (wall time x threads), over the timed section
    concurrent_timed_runs: int  # other quantlab processes on this host timing during the section

    def record(self) -> dict[str, float | int | None]:
        return {"threads": self.threads, "load_average_1m": self.load_average_1m,
                "process_cpu_share": round(self.process_cpu_share, 3), "concurrent_timed_runs": self.concurrent_timed_runs}


def _timers_folder() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"quantlab-timing-{uid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _others(folder: Path) -> set[int]:
    found = set()
    for f in folder.glob("*.json"):
        try:
            pid = int(f.stem)
        except ValueError:
            continue
        if pid != os.getpid() and _alive(pid):
            found.add(pid)
    return found


@contextmanager
def watch_machine(what: str = "") -> Iterator[list[MachineLoad]]:
    """Time a section while watching the machine; the list it yields holds one ``MachineLoad`` afterwards.

    While inside, this process is listed in a per-user folder of the host's temporary directory, so that
    another quantlab process timing at the same time sees it (and is seen)."""
    folder = _timers_folder()
    mine = folder / f"{os.getpid()}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mine.write_text(json.dumps({"pid": os.getpid(), "what": what, "since": time.time()}))
    except OSError:
        mine = None  # type: ignore[assignment]
    seen = _others(folder)
    out: list[MachineLoad] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        yield out
    finally:
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        seen |= _others(folder)
        if mine is not None:
            mine.unlink(missing_ok=True)
        threads = torch.get_num_threads()
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        out.append(MachineLoad(threads, None if load is None else round(load, 2),
                               cpu / (wall * threads) if wall > 0 else 0.0, len(seen)))
