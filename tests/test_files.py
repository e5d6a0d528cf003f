import os
import stat
from pathlib import Path

import pytest

from quantlab.files import atomic_write_text


def test_atomic_write_replaces_whole_files_with_ordinary_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "a" / "results.jsonl"
        atomic_write_text(path, "one\n")
        atomic_write_text(path, "two\n")
    finally:
        os.umask(old)
    assert path.read_text() == "two\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by the team, as open() would make it
    assert [p.name for p in path.parent.iterdir()] == ["results.jsonl"]  # no temporary files left


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "results.jsonl"
    atomic_write_text(path, "kept\n")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(path, "lost\n")
    assert path.read_text() == "kept\n" and len(list(tmp_path.iterdir())) == 1
