"""Progress of long steps: a bar when stderr is a terminal; otherwise one line at most every
``QUANTLAB_PROGRESS_INTERVAL_S`` seconds (default 30) with the elapsed time and an estimate of what is left, so a
log shows a long GPTQ solve or perplexity pass moving. A worker process's lines reach its run's log."""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
LINE_PREFIX = "quantlab: progress: "  # how a worker's progress line is told from its other output


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    if sys.stderr.isatty():
        return tqdm(items, desc=desc, total=total, leave=False, dynamic_ncols=True)
    return _lines(items, desc, total)


def _lines(items: Iterable[T], desc: str, total: int | None) -> Iterator[T]:
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    interval = float(os.environ.get("QUANTLAB_PROGRESS_INTERVAL_S", "30"))
    start = last = time.monotonic()
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= interval and (total is None or done < total):
            last = now
            print(LINE_PREFIX + progress_line(desc, done, total, now - start), file=sys.stderr, flush=True)


def progress_line(desc: str, done: int, total: int | None, elapsed_s: float) -> str:
    """``perplexity, batches of windows: 12/40 after 95 s, about 222 s left``."""
    if total:
        left = elapsed_s / done * (total - done)
        return f"{desc}: {done}/{total} after {elapsed_s:.0f} s, about {left:.0f} s left"
    return f"{desc}: {done} after {elapsed_s:.0f} s"
