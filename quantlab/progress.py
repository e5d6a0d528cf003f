"""Progress bars for long steps, shown only when stderr is a terminal."""
from __future__ import annotations

import sys
from typing import Iterable, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    return tqdm(items, desc=desc, total=total, disable=not sys.stderr.isatty(), leave=False, dynamic_ncols=True)
