"""The machine watch beside every timed decode: threads, load, CPU share, other quantlab processes timing."""
import subprocess
import sys
import time

import torch

from quantlab.engine import machine_load
from quantlab.engine.machine_load import watch_machine
from quantlab.measurements.timing_noise import Noise, busy_reasons


def test_a_section_records_threads_load_and_a_cpu_share_within_bounds() -> None:
    time.sleep(0.5)  # torch's worker threads, spinning after an earlier test's parallel work, settle first
    with watch_machine("test") as out:
        x = 0
        for i in range(200_000):
            x += i
    load = out[0]
    assert load.threads == torch.get_num_threads()
    assert load.load_average_1m is None or load.load_average_1m >= 0
    assert 0 < load.process_cpu_share <= 1.05 * max(1, 1 / load.threads) and load.concurrent_timed_runs == 0
    assert not list(machine_load._timers_folder().glob(f"{__import__('os').getpid()}.json"))  # unlisted after


def test_another_process_timing_on_the_host_is_seen_and_a_dead_one_is_not(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(machine_load, "_timers_folder", lambda: tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f"{other.pid}.json").write_text("{}")
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (tmp_path / f"{int(dead.stdout)}.json").write_text("{}")  # a process that has exited
        with watch_machine() as out:
            pass
        assert out[0].concurrent_timed_runs == 1
    finally:
        other.kill()


def test_busy_rows_are_flagged_with_the_reason() -> None:
    quiet = {"device": "cpu (2 threads)", "threads": 2, "load_average_1m": 2.4, "process_cpu_share": 0.93,
             "concurrent_timed_runs": 0}
    assert busy_reasons(quiet) == []
    assert busy_reasons({**quiet, "load_average_1m": 4.1}) == ["load 4.1 on 2 threads"]
    assert busy_reasons({**quiet, "process_cpu_share": 0.41}) == ["41% of its threads' CPU"]
    assert busy_reasons({**quiet, "concurrent_timed_runs": 1}) == ["1 other quantlab run(s) timing at once"]
    assert busy_reasons({**quiet, "device": "cuda:0 (H200)", "load_average_1m": 9.0}) == []  # CPU load: not a GPU timing
    row = {**quiet, "decode_ms_p10": 1.0, "decode_ms_p90": 1.1, "load_average_1m": 4.1}
    result = Noise().derive(row)
    assert result.noisy and result.timing_noise == "noisy: load 4.1 on 2 threads"
    assert busy_reasons({"device": "cpu"}) == []  # older records: nothing recorded, nothing claimed
