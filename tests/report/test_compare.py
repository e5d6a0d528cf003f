import math
from pathlib import Path

import pandas as pd
import pytest

from quantlab import QuantlabError
from quantlab.cli import main
from quantlab.report.compare import aligned, load_runs

from .conftest import make_row, write_run


def _two_runs(tmp_path: Path) -> list[Path]:
    a = write_run(tmp_path / "a", "cpu-run", [make_row("fp32", 19.0, 58.5, 4.0), make_row("int8", 5.8, 58.54, 2.9)])
    b = write_run(tmp_path / "b", "other-run", [make_row("int4", 4.0, 58.78, 1.2), make_row("fp32", 19.0, 58.5, 2.0)])
    return [a, b]


def test_variants_are_aligned_by_label_with_ratios_to_the_first_run(tmp_path: Path) -> None:
    table = aligned(load_runs(_two_runs(tmp_path)))
    assert list(table["variant"]) == ["fp32", "int8", "int4"]
    first, second = "cpu-run @ cpu (2 threads)", "other-run @ cpu (2 threads)"
    fp32 = table.set_index("variant").loc["fp32"]
    assert fp32[f"tokens_per_s@{first}"] == pytest.approx(250.0) and fp32[f"tokens_per_s@{second}"] == pytest.approx(500.0)
    assert fp32[f"tokens_per_s_vs_first@{second}"] == pytest.approx(2.0)
    assert fp32[f"perplexity_vs_first@{second}"] == pytest.approx(0.0)
    int8 = table.set_index("variant").loc["int8"]
    assert int8[f"status@{second}"] == "absent" and math.isnan(int8[f"tokens_per_s@{second}"])


def test_a_label_without_its_kv_format_aligns_with_the_full_label(tmp_path: Path) -> None:
    one_kv = make_row("int8", 5.8, 58.54, 2.9, weight_format="int8", kv_format="native")
    several = make_row("int8/kv-native", 5.8, 58.54, 2.5, weight_format="int8", kv_format="native")
    other = make_row("int8/kv-int4", 5.8, 58.60, 2.7, weight_format="int8", kv_format="int4")
    dirs = [write_run(tmp_path / "a", "one", [one_kv]), write_run(tmp_path / "b", "two", [several, other])]
    table = aligned(load_runs(dirs))
    assert list(table["variant"]) == ["int8", "int8/kv-int4"]
    assert table["tokens_per_s_vs_first@two @ cpu (2 threads)"][0] == pytest.approx(2.9 / 2.5)


def test_compare_command_writes_markdown_html_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = _two_runs(tmp_path)
    assert main(["compare", *map(str, dirs), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| fp32 | 250.0 | 500.0 | 2.000 |" in md
    assert "int8 in [2] (absent)" in md
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert 'id="plot-compare-speed"' in page and "<script" not in page
    long = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert len(long) == 4 and set(long["run"]) == {"cpu-run @ cpu (2 threads)", "other-run @ cpu (2 threads)"}


def test_compare_needs_two_existing_runs(tmp_path: Path) -> None:
    with pytest.raises(QuantlabError, match="at least two"):
        from quantlab.report.compare import compare_runs

        compare_runs([tmp_path], tmp_path / "out")
    assert main(["compare", str(tmp_path / "x"), str(tmp_path / "y")]) == 2


def test_a_folder_given_twice_is_compared_with_a_warning(tmp_path: Path) -> None:
    from quantlab.report.compare import compare_runs

    a, _ = _two_runs(tmp_path)
    said: list[str] = []
    compare_runs([a, a], tmp_path / "cmp", log=said.append)
    assert any(line.startswith("warning: ") and "given twice" in line for line in said)
