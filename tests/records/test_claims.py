import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantlab.records.claims import Claims, Heartbeat, owner


def _write_claim(folder: Path, key: str, generation: int, who: dict, age_s: float = 0.0) -> Path:
    path = folder / "claims" / f"{key}.{generation}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"owner": who, "claimed_at": time.time() - age_s}))
    if age_s:
        past = time.time() - age_s
        os.utime(path, (past, past))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_claim_is_exclusive_and_released(tmp_path: Path) -> None:
    claims = Claims(tmp_path)
    mine = claims.try_claim("k")
    assert mine is not None and mine.generation == 0 and mine.path.is_file()
    assert claims.try_claim("k") is None  # held by a live process (this one)
    claims.release(mine)
    again = claims.try_claim("k")
    assert again is not None and again.generation == 0


def test_a_dead_owner_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    dead = {**owner(), "pid": _dead_pid(), "pid_start_ticks": None}
    old = _write_claim(tmp_path, "k", 0, dead)
    claim = Claims(tmp_path).try_claim("k")
    assert claim is not None and claim.generation == 1
    assert not old.exists()  # the dead owner's file is cleared
    assert json.loads(claim.path.read_text())["took_over"]["pid"] == dead["pid"]


def test_another_machines_claim_is_stale_only_after_its_heartbeat_stops(tmp_path: Path) -> None:
    elsewhere = {"host": "node-7", "machine_id": "not-this-machine", "pid": 1, "pid_start_ticks": 1}
    _write_claim(tmp_path, "fresh", 0, elsewhere)
    _write_claim(tmp_path, "silent", 0, elsewhere, age_s=600)
    claims = Claims(tmp_path, stale_after_s=120)
    assert claims.try_claim("fresh") is None
    taken = claims.try_claim("silent")
    assert taken is not None and taken.generation == 1
    assert not claims.current("fresh").stale(120) and claims.current("silent").owner == owner()  # fresh kept, silent taken


def _race(folder: str, key: str, barrier: "multiprocessing.synchronize.Barrier", out: "multiprocessing.Queue") -> None:
    claims = Claims(Path(folder))
    barrier.wait()
    claim = claims.try_claim(key)
    out.put(None if claim is None else claim.generation)
    time.sleep(1.0)  # hold it while the others look


def test_of_processes_racing_for_a_stale_claim_exactly_one_wins(tmp_path: Path) -> None:
    _write_claim(tmp_path, "k", 3, {**owner(), "pid": _dead_pid(), "pid_start_ticks": None})
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), "k", barrier, out)) for _ in range(6)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sorted(results, key=str) == [4] + [None] * 5 or sorted(r for r in results if r is not None) == [4]
    assert sum(r is not None for r in results) == 1


def test_the_heartbeat_keeps_a_claim_fresh(tmp_path: Path) -> None:
    claim = Claims(tmp_path).try_claim("k")
    past = time.time() - 1000
    os.utime(claim.path, (past, past))
    with Heartbeat(claim, interval_s=0.05):
        time.sleep(0.3)
    assert claim.age_s < 5


@pytest.mark.parametrize("missing", [True, False])
def test_the_machine_id_falls_back_to_the_boot_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, missing: bool) -> None:
    from quantlab.records import fingerprint

    machine = tmp_path / "machine-id"
    if not missing:
        machine.write_text("abc123\n")
    monkeypatch.setattr(fingerprint, "MACHINE_ID_FILES", (str(machine),))
    ident, source = fingerprint.machine_id()
    if missing:
        assert source in (fingerprint.BOOT_ID_FILE, "host name (no machine or boot id)") and ident
    else:
        assert (ident, source) == ("abc123", str(machine))
