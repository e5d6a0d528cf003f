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


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["report", "--help"], ["formats", "--help"]])
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
