"""Result records and the JSONL store. Rows are keyed by the variant's config hash; writes are atomic."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

RESULTS_FILE = "results.jsonl"
MANIFEST_FILE = "manifest.json"


def _umask_mode() -> int:
    """The mode a plain ``open()`` would give a new file (mkstemp's own is 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it into place with ordinary
    permissions (mkstemp's own are 0600): readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, synced to disk before it replaces the old file."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class ResultStore:
    """The rows of one output directory, one per variant key, in recipe order."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / RESULTS_FILE
        self.rows: dict[str, dict[str, Any]] = {r["variant_key"]: r for r in read_jsonl(self.path)}

    def finished(self, key: str) -> bool:
        row = self.rows.get(key)
        return row is not None and row.get("status") == "ok"

    def put(self, row: dict[str, Any]) -> None:
        self.rows[row["variant_key"]] = row
        self.flush()

    def flush(self) -> None:
        text = "".join(json.dumps(r, sort_keys=False) + "\n" for r in self.rows.values())
        atomic_write_text(self.path, text)

    def ordered(self, keys: list[str]) -> list[dict[str, Any]]:
        return [self.rows[k] for k in keys if k in self.rows]
