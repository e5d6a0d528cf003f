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


def test_export_folders_are_one_short_name_per_label(tmp_path: Path) -> None:
    from quantlab.files import export_folder

    assert export_folder(tmp_path, "int4-g32/kv-native", "gguf") == tmp_path / "exports" / "int4-g32_kv-native" / "gguf"
    mix = "fp32+int8-g32-asym@" + ",".join(f"model.layers.{i}" for i in range(40)) + "/kv-int8-g32-r0"
    a = export_folder(tmp_path, mix, "gguf")
    assert len(a.parent.name) == 93 and a.parent.name.startswith("fp32+int8-g32-asym_model.layers.0_model")
    assert a == export_folder(tmp_path, mix, "gguf")  # the same label, the same folder
    other = export_folder(tmp_path, mix[:-1] + "1", "gguf")  # differs only after the cut: another folder
    assert other.parent != a.parent
