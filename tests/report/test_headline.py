"""The answer at the top of both reports, the summary table under it, and timings that cannot mislead: runs where
every row, no row and some rows were timed on a busy machine, where no variant meets the tolerance, ties."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantlab.report import load_rows, run_summary, write_report
from quantlab.report.headline import Rules, footprint, headline
from quantlab.report.summary import summary

from .conftest import MIB, make_row, write_run


def noisy(record: dict, load: float = 6.6) -> dict:
    """The record as a busy machine would have left it: every point timed under a load above its threads."""
    for point in record["points"]:
        point["measurements"]["latency"].update(threads=2, load_average_1m=load)
    return record


def diverging(record: dict, kl: float, delta: float = 0.1, half_width: float = 0.05) -> dict:
    record["measurements"]["divergence"] = {
        "kl_divergence_mean": kl, "kl_divergence_median": kl / 2, "kl_divergence_p90": kl * 2,
        "kl_divergence_p99": kl * 5, "kl_divergence_max": kl * 20, "top1_agreement_percent": 100 - 100 * kl,
        "next_token_prob_rms_diff": kl, "delta_perplexity": delta, "delta_perplexity_ci95_low": delta - half_width,
        "delta_perplexity_ci95_high": delta + half_width, "divergence_protocol": {
            "baseline": "bf16", "windows": 4, "window_tokens": 64, "scored_tokens": 252, "top_k": None,
            "baseline_rest_mass_mean": 0.0, "baseline_perplexity": 58.5, "reference": "r", "text": "t",
            "text_sha256": "0" * 64}}
    return record


def rows_of(folder: Path) -> tuple[list[dict], dict]:
    return load_rows(folder)


def answers(folder: Path) -> dict:
    rows, manifest = rows_of(folder)
    return {a.key: a for a in headline(rows, manifest, "RERUN").answers}


def test_footprint_is_weights_plus_the_kv_cache_of_the_first_point(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "bytes", [make_row("bf16", 9.5, 58.5, 3.0), make_row("int8", 5.8, 58.6, 2.0)])
    rows, _ = rows_of(run)
    assert footprint(rows[1]) == int(5.8 * MIB) + 1000 * 16  # the first point: prompt 16, 1000 B per position
    table = summary(rows, "bf16", {})
    assert table.rows[1].cells[0].text == f"5.815 (×{footprint(rows[1]) / footprint(rows[0]):.2f})"


def test_no_row_noisy_the_answer_names_all_three_and_every_speed_has_its_ratio(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.50, 4.0), make_row("int8", 5.8, 58.52, 2.0), make_row("int4", 4.0, 58.70, 2.4),
            make_row("int3", 3.2, 70.0, 1.0)]
    run = write_run(tmp_path / "run", "quiet", rows)
    got = answers(run)
    assert got["smallest"].variant == "int4"  # +0.34% is within 1%; int3 (+19.7%) is smaller but not within
    assert got["budget"].variant == "int4"  # within half of bf16's bytes: int4 (0.42) fits, int8 (0.61) does not
    assert got["fastest"].variant == "int8"  # int3 is faster, but outside the tolerance
    md = write_report(run).read_text()
    assert md.index("## The answer") < md.index("| variant |") < md.index("## Details")
    assert "**Timing:**" not in md and "~~" not in md
    int8 = next(ln for ln in md.splitlines() if ln.startswith("| int8 "))
    assert int8.endswith("| 2.12 (×2.00) |")  # ms/token with its speed ratio to bf16's (4.25 ms at prompt 16)
    page = (run / "report.html").read_text()
    assert 'id="answer"' in page and 'class="noisy"' not in page and 'id="timing-banner"' not in page


def test_budget_is_a_share_of_the_baseline_or_the_bytes_the_recipe_sets(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.50, 4.0), make_row("int8", 5.8, 58.52, 2.0), make_row("int4", 4.0, 58.70, 2.4)]
    run = write_run(tmp_path / "run", "budget", rows)
    listed, manifest = rows_of(run)
    limit = 0.5 * footprint(listed[0])
    assert footprint(listed[1]) > limit >= footprint(listed[2])
    assert answers(run)["budget"].variant == "int4"  # the only one within half of bf16's bytes
    manifest["recipe"]["report"] = {"budget_bytes": int(6 * MIB)}
    head = headline(listed, manifest)
    assert head.answers[1].variant == "int8" and "6.000 MiB (report.budget_bytes)" in head.answers[1].title
    manifest["recipe"]["report"] = {"budget_bytes": 1000}
    assert headline(listed, manifest).answers[1].variant is None  # nothing fits: said, with the smallest measured


def test_no_variant_within_the_tolerance_is_said_with_the_closest(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.5, 4.0), make_row("int4", 4.0, 62.0, 2.4), make_row("int3", 3.2, 80.0, 2.0)]
    run = write_run(tmp_path / "run", "lossy", rows)
    got = answers(run)
    assert got["smallest"].variant is None
    assert "no variant smaller than the baseline stays within the tolerance" in got["smallest"].text
    assert "closest smaller one is **int4**" in got["smallest"].text
    assert got["fastest"].variant == "bf16"  # only the baseline is within the tolerance
    md = write_report(run).read_text()
    assert "no variant smaller than the baseline stays within the tolerance" in md


def test_every_row_noisy_voids_the_speed_answer_struck_cells_and_plots(tmp_path: Path) -> None:
    rows = [noisy(make_row("bf16", 9.5, 58.5, 4.0)), noisy(make_row("int8", 5.8, 58.52, 2.0)),
            noisy(make_row("int4", 4.0, 58.7, 2.4))]
    run = write_run(tmp_path / "run", "busy", rows)
    listed, manifest = rows_of(run)
    head = headline(listed, manifest, "RERUN")
    assert head.all_noisy and head.answers[2].variant is None
    assert "no trustworthy timing: all 3 timed rows were flagged noisy" in head.answers[2].text
    assert head.answers[0].variant == "int4"  # quality and bytes still answer
    md = write_report(run).read_text()
    assert "**Timing:** Every timed row was timed on a busy or noisy machine" in md
    assert "--retime" in md
    table = [ln for ln in md.split("## Details")[0].splitlines() if ln.startswith("| ") and "variant" not in ln]
    assert [ln.rsplit("|", 2)[1].strip() for ln in table] == ["~~4.25~~", "~~2.12~~", "~~2.55~~"]  # no speed ratio
    details = [ln for ln in md.split("## Details")[1].split("\n\n")[1].splitlines() if ln.startswith("| bf16")][0]
    assert "~~4.25 (3.60–4.80)~~" in details and "%" not in details  # the roofline share left blank
    page = (run / "report.html").read_text()
    assert page.count('<td class="noisy"') >= 3 and 'id="timing-banner"' in page
    assert '<figure id="plot-latency">' not in page  # nothing trustworthy to plot
    assert "Left out, timed on a busy or noisy machine" not in page or "plot-context" in page


def test_some_rows_noisy_are_marked_with_their_reason_and_left_out_of_the_speed_answer(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.5, 4.0), noisy(make_row("int8", 5.8, 58.52, 1.0)),
            make_row("int4", 4.0, 58.7, 2.4)]
    run = write_run(tmp_path / "run", "some", rows)
    got = answers(run)
    assert got["fastest"].variant == "int4" and "Left out as noisy: int8" in got["fastest"].text
    md = write_report(run).read_text()
    assert "**Timing:** 1 of 3 timed rows was timed on a busy or noisy machine" in md
    assert "| int8 ◆ [1] |" in md and "[1] timed on a busy or noisy machine (load 6.6 on 2 threads)" in md
    page = (run / "report.html").read_text()
    caption = page.split('<figure id="plot-latency">')[1].split("</figcaption>")[0]
    assert "Left out, timed on a busy or noisy machine: int8." in caption


def test_kl_judges_the_tolerance_and_ranks_the_budget_where_divergence_was_measured(tmp_path: Path) -> None:
    rows = [diverging(make_row("bf16", 9.5, 58.5, 4.0), 0.0, 0.0),
            diverging(make_row("int8", 5.8, 58.52, 2.0), 0.002, 0.02),
            diverging(make_row("int4-a", 4.0, 58.9, 2.4), 0.030, 0.40),  # outside 0.01 nats
            diverging(make_row("int4-b", 4.0, 58.8, 2.4), 0.009, 0.30)]  # within, same bytes as int4-a
    run = write_run(tmp_path / "run", "kl", rows)
    got = answers(run)
    assert got["smallest"].variant == "int4-b" and "mean KL 0.009 nats" in got["smallest"].text
    assert got["budget"].variant == "int4-b"  # within half of bf16's bytes: int4-a and int4-b, ranked by KL
    md = write_report(run).read_text()
    head_row = [ln for ln in md.splitlines() if ln.startswith("| variant |")][0]
    assert head_row.count("|") - 1 <= 8  # a compact table, readable in a terminal
    assert "mean KL" in head_row and "Δppl (95% interval)" in head_row and "top-1 %" in head_row
    assert "| +0.300 (+0.250–+0.350) |" in md


def test_two_variants_at_the_same_bytes_are_said_to_tie(tmp_path: Path) -> None:
    rows = [make_row("fp32", 19.0, 58.5, 4.0), make_row("int4-rtn", 4.0, 58.78, 2.4),
            make_row("int4-gptq", 4.0, 58.59, 2.4)]
    got = answers(write_run(tmp_path / "run", "tie", rows))
    assert got["smallest"].variant == "int4-gptq"
    assert "Tied in bytes (within 0.5%) with **int4-rtn**" in got["smallest"].text


def test_the_recipe_sets_the_tolerance(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.5, 4.0), make_row("int4", 4.0, 59.5, 2.4)]
    run = write_run(tmp_path / "run", "tol", rows)
    rows_, manifest = rows_of(run)
    assert headline(rows_, manifest).answers[0].variant is None  # +1.7% > 1%
    manifest["recipe"]["report"] = {"perplexity_tolerance_percent": 2.0}
    head = headline(rows_, manifest)
    assert head.answers[0].variant == "int4" and "at most 2% above" in head.rule_text
    assert Rules.from_manifest(manifest).kl_tolerance_nats == 0.01


def test_the_command_line_summary_ends_with_the_report_paths(tmp_path: Path) -> None:
    rows = [make_row("bf16", 9.5, 58.5, 4.0), noisy(make_row("int8", 5.8, 58.52, 2.0))]
    run = write_run(tmp_path / "run", "cli", rows)
    write_report(run)
    text = run_summary(run)
    lines = text.splitlines()
    assert lines[0].startswith("cli: 2 of 2 variants measured") and "smallest within tolerance  int8" in text
    assert "timing: 1 of 2 rows were timed on a busy or noisy machine" in text and "--retime" in text
    assert lines[-2] == f"report: {run / 'report.html'}" and lines[-1].strip() == str(run / "report.md")


@pytest.mark.parametrize("flag", [True, False])
def test_report_summary_flag_prints_the_answer_instead_of_the_path(tmp_path: Path, flag: bool, capsys) -> None:
    from quantlab.cli import main

    run = write_run(tmp_path / "run", "flag", [make_row("bf16", 9.5, 58.5, 4.0), make_row("int8", 5.8, 58.52, 2.0)])
    assert main(["report", str(run), *(["--summary"] if flag else [])]) == 0
    out = capsys.readouterr().out
    assert ("smallest within tolerance" in out) == flag and out.rstrip().endswith("report.md")
    assert json.loads((run / "manifest.json").read_text())["baseline"] == "bf16"


def test_variants_no_smaller_than_the_baseline_to_within_half_a_percent_are_not_an_answer(tmp_path: Path) -> None:
    """A KV format that saves a few hundred KiB beside 500 MiB of weights at this workload is not a smaller model."""
    rows = [make_row("bf16/kv-native", 500.0, 25.29, 4.0), make_row("bf16/kv-fp8", 499.0, 25.50, 4.0),
            make_row("bf16/kv-int8", 499.5, 25.26, 4.0)]
    got = answers(write_run(tmp_path / "run", "kv", rows))
    assert got["smallest"].variant is None
    assert "no variant is materially smaller than the baseline" in got["smallest"].text
    assert "the smallest, **bf16/kv-fp8**, saves 1.000 MiB" in got["smallest"].text


def test_among_variants_of_the_same_bytes_the_lowest_loss_is_named(tmp_path: Path) -> None:
    rows = [make_row("fp32", 19.0, 58.5, 4.0), make_row("int4-a", 4.00, 58.78, 2.4),
            make_row("int4-b", 4.01, 58.59, 2.4)]  # b is 0.25% larger and better: the tie names b
    got = answers(write_run(tmp_path / "run", "tie2", rows))
    assert got["smallest"].variant == "int4-b" and "Tied in bytes (within 0.5%) with **int4-a**" in got["smallest"].text
