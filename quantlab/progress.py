"""Progress of long steps: a bar when stderr is a terminal; otherwise one line at most every
``QUANTLAB_PROGRESS_INTERVAL_S`` seconds (default 30) with the elapsed time and an estimate of what is left, so a
log shows a long GPTQ solve or perplexity pass moving. A single item, or a ``stage`` with nothing to count (a
model load, a compilation), that runs past the interval says so every interval too, on a terminal or off one. A
worker process's lines reach its run's log."""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
LINE_PREFIX = "quantlab: progress: "  # how a worker's progress line is told from its other output


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    if sys.stderr.isatty():
        return tqdm(items, desc=desc, total=total, leave=False, dynamic_ncols=True)
    return _lines(items, desc, total)


def _interval() -> float:
    return float(os.environ.get("QUANTLAB_PROGRESS_INTERVAL_S", "30"))


class Ticker:
    """A daemon thread that prints ``say(elapsed_s)`` every interval in which its owner said nothing (``spoke``):
    what keeps a log moving through one long step."""

    def __init__(self, say: Callable[[float], str], interval_s: float) -> None:
        self.say, self.interval_s = say, interval_s
        self.spoke = threading.Event()
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="quantlab-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.spoke.is_set():
                self.spoke.clear()
                continue
            print(LINE_PREFIX + self.say(time.perf_counter() - self._start), file=sys.stderr, flush=True)

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextmanager
def stage(desc: str) -> Iterator[None]:
    """A step with nothing to count (loading a model, compiling): past the interval, a line every interval."""
    with Ticker(lambda s: f"{desc}: still running after {s:.0f} s", _interval()):
        yield


def _lines(items: Iterable[T], desc: str, total: int | None) -> Iterator[T]:
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    interval = _interval()
    start = last = time.monotonic()
    done = 0
    with Ticker(lambda s: progress_line(desc, done, total, s) + " (one step still running)", interval) as ticker:
        for item in items:
            yield item
            done += 1
            now = time.monotonic()
            if now - last >= interval and (total is None or done < total):
                last = now
                ticker.spoke.set()
                print(LINE_PREFIX + progress_line(desc, done, total, now - start), file=sys.stderr, flush=True)


def progress_line(desc: str, done: int, total: int | None, elapsed_s: float) -> str:
    """``perplexity, batches of windows: 12/40 after 95 s, about 222 s left``."""
    if total and done:
        left = elapsed_s / done * (total - done)
        return f"{desc}: {done}/{total} after {elapsed_s:.0f} s, about {left:.0f} s left"
    return f"{desc}: {done}{f'/{total}' if total else ''} after {elapsed_s:.0f} s"
