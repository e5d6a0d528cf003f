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
