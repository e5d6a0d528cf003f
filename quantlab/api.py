"""The library's one-call run: measure a recipe's variants (``run.runner``), then rebuild the views of the run
folder from its records (``report``), as ``quantlab run`` does."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from .records import RunFolder


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_recipe(recipe: Any, out_dir: Path | None = None, *, log: Callable[[str], None] = _stderr,
               **options: Any) -> Path:
    """Measure every variant of ``recipe`` that ``out_dir`` has no record of (``run.runner.run_recipe``: ``shard``,
    ``executor``, ``retime``, ``add``), then write the reports, tables and results.jsonl. Returns ``out_dir``."""
    from .report import write_report
    from .run.runner import run_recipe as measure

    out = measure(recipe, out_dir, log=log, **options)
    if RunFolder(out).has_records():
        write_report(out, log=log)
    return out
