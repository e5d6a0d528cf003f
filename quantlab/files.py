"""Atomic file writes and JSON-lines reading, for records and every view of a run folder."""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

RESULTS_FILE = "results.jsonl"
MANIFEST_FILE = "manifest.json"
EXPORTS_DIR = "exports"


def export_folder(run_folder: Path, label: str, to: str) -> Path:
    """``exports/<label>/<target>`` under the run folder, the label made a folder name (a label over 96 characters,
    a per-layer mix's, cut to 80 and followed by a digest of the whole, so that it stays one short name)."""
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", label)
    if len(name) > 96:
        import hashlib

        name = f"{name[:80]}-{hashlib.sha256(label.encode()).hexdigest()[:12]}"
    return run_folder / EXPORTS_DIR / name / to


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


def save_safetensors(tensors: dict[str, Any], path: Path, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` through ``atomic_write``: whole or absent, and with the permissions a plain
    ``open()`` gives (safetensors itself creates its files 0600)."""
    from safetensors.torch import save_file

    atomic_write(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def read_jsonl(path: Path, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file. A torn last line (a crash mid-write) is skipped with a warning naming
    the file and line; a corrupt line before the last is an error naming them."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == last:
                if log is not None:
                    log(f"warning: {path}: line {i + 1} is torn (a write cut short); skipped, that variant is measured again")
                continue
            from .errors import QuantlabError

            raise QuantlabError(f"{path}: line {i + 1} is not valid JSON ({e.msg})") from None
    return rows
