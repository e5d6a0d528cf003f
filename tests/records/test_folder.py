import json
import shutil
from pathlib import Path

import pytest

from quantlab import QuantlabError
from quantlab.files import read_jsonl
from quantlab.records.claims import owner
from quantlab.records.folder import RunFolder, reusable


def _record(key: str, status: str = "ok", fid: str = "me", sweep: int = 0, writer: dict | None = None) -> dict:
    return {"variant_key": key, "variant": key, "status": status, "fingerprint_id": fid, "sweep": sweep,
            "writer": writer or owner(), "measurements": {}, "points": []}


def test_a_replaced_record_is_kept_not_deleted(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.write_record(_record("a", status="failed"))
    folder.write_record(_record("a"))
    assert folder.read_record("a")["status"] == "ok"
    kept = list((tmp_path / "records" / "replaced").iterdir())
    assert len(kept) == 1 and json.loads(kept[0].read_text())["status"] == "failed"
    assert list(folder.records()) == ["a"]


def test_sweeps_are_joined_while_open_and_started_anew_once_complete(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    assert folder.join_or_start_sweep() == (0, True)
    assert folder.join_or_start_sweep() == (0, False)  # a second process joins the open sweep
    folder.complete_sweep(0)
    assert folder.join_or_start_sweep() == (1, True)


def test_what_is_reused() -> None:
    elsewhere = {"host": "node-7", "machine_id": "other", "pid": 1}
    assert reusable(None, "me", 3) is None
    assert reusable(_record("a", fid="me", sweep=1), "me", 3) == "already measured, skipped"  # same machine, any sweep
    assert "this sweep" in reusable(_record("a", fid="peer", sweep=3, writer=elsewhere), "me", 3)  # a peer's share
    assert reusable(_record("a", fid="other", sweep=2), "me", 3) is None  # another machine, an earlier sweep
    assert reusable(_record("a", status="failed", sweep=2), "me", 3) is None  # failures are retried by the next sweep
    assert reusable(_record("a", status="failed", sweep=3), "me", 3) is not None  # not twice in one (writer alive)
    dead = {**owner(), "pid": 2**22 + 12345}
    assert reusable(_record("a", status="failed", sweep=3, writer=dead), "me", 3) is None  # its writer has exited


def test_a_corrupt_record_is_a_one_line_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "abc.json").write_text('{"variant_key": "abc", ')
    with pytest.raises(QuantlabError, match=r"records/abc.json: not a valid record \(line 1"):
        RunFolder(tmp_path).records()


def test_a_torn_last_line_is_skipped_with_a_warning_and_a_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b"')
    warnings: list[str] = []
    assert read_jsonl(path, log=warnings.append) == [{"a": 1}, {"a": 2}]
    assert len(warnings) == 1 and f"{path}: line 3 is torn" in warnings[0]
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(QuantlabError, match=rf"{path}: line 2 is not valid JSON"):
        read_jsonl(path)


def test_an_unwritable_or_file_output_is_refused_before_measuring(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(QuantlabError, match="is an existing file"):
        RunFolder(target).check_writable()


LEGACY = Path(__file__).parents[1] / "data" / "legacy-results.jsonl"  # two rows of a results.jsonl from before records


def test_an_older_results_jsonl_folder_is_converted_once_with_its_figures(tmp_path: Path) -> None:
    from quantlab.report import load_rows

    shutil.copy(LEGACY, tmp_path / "results.jsonl")
    old = read_jsonl(LEGACY)
    logs: list[str] = []
    rows, manifest = load_rows(tmp_path, logs.append)
    assert any("converted 2 rows" in m for m in logs) and len(list((tmp_path / "records").glob("*.json"))) == 2
    for before, after in zip(old, rows):
        for field in ("variant", "weight_bytes", "weight_bytes_analytic", "kv_cache_bytes", "peak_memory_bytes",
                      "decode_ms_per_token", "tokens_per_s", "perplexity", "perplexity_protocol", "kernel_path"):
            assert after[field] == before[field], field
        assert after["roofline_share"] == pytest.approx(before["roofline_share"], abs=1e-4)  # from its own bandwidth
        assert after["fingerprint_id"].startswith("legacy-")  # never matches a machine: measured again by a run
    logs.clear()
    load_rows(tmp_path, logs.append)
    assert logs == []  # read once


def test_a_torn_last_row_of_an_older_folder_is_skipped_and_measured_again(tmp_path: Path) -> None:
    from quantlab.report import load_rows

    text = LEGACY.read_text()
    (tmp_path / "results.jsonl").write_text(text[: len(text) - 50])  # a crash mid-write
    logs: list[str] = []
    rows, _ = load_rows(tmp_path, logs.append)
    assert len(rows) == 1 and any("line 2 is torn" in m for m in logs)
