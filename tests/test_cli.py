import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantlab.cli import main


def test_formats_lists_every_registered_format(capsys: pytest.CaptureFixture[str]) -> None:
    from quantlab import KV_FORMATS, WEIGHT_FORMATS

    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for name in WEIGHT_FORMATS.names() + KV_FORMATS.names():
        assert f"  {name} " in out


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["report", "--help"], ["formats", "--help"],
                                  ["estimate", "--help"]])
def test_help_at_every_level(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0 and "usage: quantlab" in capsys.readouterr().out


def test_bad_recipe_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump({"name": "bad", "model": {"bundled": "tiny-stdlib-llama"},
                                      "weights": [{"format": "int4", "group_sise": 128}]}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "quantlab.cli", "run", str(recipe), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert f"{recipe}: weights[0].group_sise: unknown field" in proc.stderr
    assert not out.exists()


def test_report_of_a_missing_folder_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "none")]) == 2
    assert "no such results folder" in capsys.readouterr().err


CONFIGS = Path(__file__).parents[1] / "evals" / "configs"


def test_estimate_json_reproduces_the_gemma3_1b_worksheet(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv = ["estimate", str(CONFIGS / "gemma-3-1b.json"), "--seq-len", "32768", "--kv-format", "native", "int4",
            "--weight-format", "bf16", "int4:group_size=128,symmetric=true", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["param_count"] == 999_885_952
    assert out["kv_cache_bytes_full"]["native"] == 872_415_232
    assert out["kv_cache_bytes_retained"]["native"] == 145_752_064
    assert 2 * 999_885_952 <= out["weight_bytes"]["bf16"] <= 2 * 999_885_952 + 4096  # + rotary buffers
    assert out["weight_bytes"]["int4-g128-sym"] < out["weight_bytes"]["bf16"] / 2
    assert out["projections"]["self_attn.q_proj"] == {"in": 1152, "out": 1024}
    assert {e["meaning"] for e in out["evidence"]} >= {"residual width", "KV heads", "head width", "attention pattern"}


def test_estimate_markdown_has_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(CONFIGS / "gpt2.json")]) == 0
    out = capsys.readouterr().out
    for heading in ("## Evidence", "## Projections", "## Parameters", "## Weight payload", "## KV cache", "## Assumptions"):
        assert heading in out
    assert "| KV heads | 12 | implementation |" in out and "124,439,808 parameters" in out


@pytest.mark.parametrize("argv,message", [
    (["estimate", "missing.json"], "missing.json: no such config file"),
    (["estimate", str(CONFIGS / "gpt2.json"), "--weight-format", "int5"], "unknown weight format 'int5'"),
    (["estimate", str(CONFIGS / "gpt2.json"), "--weight-format", "int4:group_sise=128"], "group_sise: unknown field"),
    (["estimate", str(CONFIGS / "gpt2.json"), "--kv-format", "int4:bits"], "expected field=value"),
])
def test_estimate_bad_input_is_one_line_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0
