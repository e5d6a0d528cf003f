"""Progress off a terminal: a line at most every interval, with the elapsed time and what is left."""
import pytest

import quantlab.progress as progress_module
from quantlab.progress import LINE_PREFIX, progress, progress_line


def test_off_a_terminal_a_line_comes_at_most_every_interval(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    clock = iter(float(t) for t in [0, 10, 31, 40, 62, 63, 100])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(progress_module.sys.stderr, "isatty", lambda: False)
    assert list(progress(range(6), "layers")) == list(range(6))
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [LINE_PREFIX + "layers: 2/6 after 31 s, about 62 s left",
                     LINE_PREFIX + "layers: 4/6 after 62 s, about 31 s left"]  # none for the last item


def test_a_line_without_a_total_counts_only() -> None:
    assert progress_line("batches", 7, None, 12.4) == "batches: 7 after 12 s"


def test_a_stage_or_a_single_slow_item_says_it_is_still_running(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from quantlab.progress import stage

    monkeypatch.setenv("QUANTLAB_PROGRESS_INTERVAL_S", "0.05")
    monkeypatch.setattr(progress_module.sys.stderr, "isatty", lambda: False)
    with stage("loading the model"):
        time.sleep(0.18)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) >= 2 and all(ln.startswith(LINE_PREFIX + "loading the model: still running after ") for ln in lines)
    with stage("quick"):
        pass
    for item in progress([1, 2], "perplexity batches"):
        time.sleep(0.12 if item == 1 else 0)  # one item longer than the interval, nothing counted yet
    err = capsys.readouterr().err
    assert "quick" not in err
    assert LINE_PREFIX + "perplexity batches: 0/2 after 0 s (one step still running)" in err
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # the ticker stopped with its loop
