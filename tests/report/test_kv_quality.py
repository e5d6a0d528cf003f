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


def test_the_banner_names_what_was_left_out_and_what_read_the_cache_and_agrees_with_the_fronts(tmp_path: Path) -> None:
    """Perplexity through the cache (kv-chunked) stays on its front; divergence, which ran without the cache, is
    left out of the KV rows and so off the KL front; the banner says exactly that, with no advice to do what the
    run already did."""
    from tests.report.test_headline import diverging

    rows = [diverging(make_row("bf16", 9.5, 58.5, 4.0, weight_format="bf16", kv_format="native"), 0.0, 0.0),
            diverging(make_row("int4/kv-native", 4.0, 58.78, 2.4, weight_format="int4", kv_format="native"), 0.02),
            diverging(make_row("int4/kv-int4", 3.9, 58.90, 2.3, weight_format="int4", kv_format="int4-g32"), 0.02)]
    for r in rows:
        r["measurements"]["perplexity"]["perplexity_protocol"] = KV_CHUNKED
    folder = write_run(tmp_path / "run", "kv", rows)
    report = write_report(folder).read_text()
    banner = next(ln for ln in report.splitlines() if ln.startswith("**Quality not measured through the KV cache**"))
    assert "for int4/kv-int4: divergence ran without the cache" in banner
    assert "Their perplexity went through the cache and is shown" in banner and "kv-chunked" not in banner
    front = next(ln for ln in report.splitlines() if ln.startswith("◆ Pareto front of perplexity"))
    assert "int4/kv-int4" in front  # its perplexity read the cache: on the perplexity front, as the banner says
    int4_kv = next(ln for ln in report.splitlines() if ln.startswith("| int4/kv-int4"))
    assert "| — | — |" in int4_kv and "[1]" in int4_kv  # KL and top-1 left out, with the note's marker
    page = (folder / "report.html").read_text()
    figure = page.split('<figure id="plot-divergence">')[1].split("</figure>")[0]
    assert "int4/kv-int4" not in figure  # neither a point nor on the front of KL


def test_a_kv_format_that_kept_most_positions_in_full_precision_says_so_in_its_row(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.5, 4.0), make_row("bf16/kv-int4-r128", 9.5, 58.5, 4.0, kv_format="int4-r128"),
            make_row("bf16/kv-int4-r8", 9.5, 58.6, 4.0, kv_format="int4-r8")]
    for r, kept in zip(rows[1:], (16, 8)):
        for p in r["points"]:
            p["measurements"]["kv_cache"]["kv_cache_full_precision_tokens"] = min(kept, p["prompt_tokens"] + 5)
    for r in rows:
        r["measurements"]["perplexity"]["perplexity_protocol"] = KV_CHUNKED
    report = write_report(write_run(tmp_path / "run", "residual", rows)).read_text()
    assert next(ln for ln in report.splitlines() if ln.startswith("| bf16/kv-int4-r128")).count("[1]") == 1
    assert "[1] its KV format kept 16 of the 21 cached positions in full precision (residual_tokens)" in report
    assert "[" not in next(ln for ln in report.splitlines() if ln.startswith("| bf16/kv-int4-r8 "))  # 8 of 21
