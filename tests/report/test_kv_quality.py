"""A KV row's quality figures appear only when they went through its KV cache."""
import json
from pathlib import Path

from quantlab.files import read_jsonl
from quantlab.report import write_report
from tests.report.conftest import PROTOCOL, make_row, write_run

KV_CHUNKED = {**PROTOCOL, "name": "kv-chunked", "chunk_tokens": 16}


def _run(tmp_path: Path, protocol: dict) -> Path:
    rows = [make_row("int4/kv-native", 4.0, 58.78, 2.4, weight_format="int4", kv_format="native"),
            make_row("int4/kv-int4", 4.0, 58.78, 2.3, weight_format="int4", kv_format="int4-g32"),
            make_row("int8/kv-int4", 5.8, 58.54, 2.9, weight_format="int8", kv_format="int4-g32")]
    for r in rows:
        r["measurements"]["perplexity"]["perplexity_protocol"] = protocol
    return write_run(tmp_path / protocol["name"], "kv", rows)


def test_figures_that_did_not_read_the_cache_are_left_out_of_kv_rows_and_off_the_front(tmp_path: Path) -> None:
    folder = _run(tmp_path, PROTOCOL)
    report = write_report(folder).read_text()
    rows = {r["variant"]: r for r in read_jsonl(folder / "results.jsonl")}
    assert rows["int4/kv-native"]["perplexity"] == 58.78 and "kv_cache_not_read_by" not in rows["int4/kv-native"]
    for kv_row in ("int4/kv-int4", "int8/kv-int4"):
        assert rows[kv_row].get("perplexity") is None and rows[kv_row]["kv_cache_not_read_by"] == ["perplexity"]
    assert "Quality not measured through the KV cache** for int4/kv-int4, int8/kv-int4" in report
    assert "Pareto front of perplexity against weights + KV-cache bytes: int4/kv-native." in report
    record = json.loads((folder / "records" / "int4_kv-int4.json").read_text())
    assert record["measurements"]["perplexity"]["perplexity"] == 58.78  # the record keeps what was measured
    assert "not measured through the KV cache" in (folder / "report.html").read_text()


def test_a_protocol_that_reads_the_cache_keeps_every_row(tmp_path: Path) -> None:
    folder = _run(tmp_path, KV_CHUNKED)
    report = write_report(folder).read_text()
    rows = read_jsonl(folder / "results.jsonl")
    assert [r["perplexity"] for r in rows] == [58.78, 58.78, 58.54]
    assert not any("kv_cache_not_read_by" in r for r in rows) and "not measured through" not in report
