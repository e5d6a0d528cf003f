"""A recipe's export: writes deployable folders from the measured model; `quantlab export` writes the same bytes
later from the run folder, after checking that it holds the numbers that were measured."""
import json
from pathlib import Path

import pytest

from quantlab import run_recipe, validate_recipe
from quantlab.cli import main
from quantlab.extend import WEIGHT_FORMATS

pytest.importorskip("gguf")

WORKLOAD = {"batch_size": 1, "prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"}
INT4 = {"format": "int4", "group_size": 32, "symmetric": True, "compute_dtype": "bfloat16"}  # torch's int4 kernel


def test_a_run_exports_what_it_measured_and_the_cli_writes_the_same_file(small_model_dir: Path, tmp_path: Path,
                                                                         capsys) -> None:
    int4 = WEIGHT_FORMATS["int4"].build(**{k: v for k, v in INT4.items() if k != "format"}).label
    recipe = validate_recipe({
        "name": "exports", "model": {"path": str(small_model_dir)}, "weights": ["fp32", INT4, "nf4"],
        "workload": WORKLOAD, "isolation": "none", "device": "cpu",
        "export": [{"variants": [int4, "nf4-b64"], "to": ["gguf", "gptq"]}],
    })
    out = run_recipe(recipe, tmp_path / "run", log=lambda _: None)
    records = {r["variant"]: r for r in (json.loads(p.read_text()) for p in (out / "records").glob("*.json"))}
    exports = {e["to"]: e for e in records[int4]["exports"]}
    assert records[int4]["measurements"]["weights"]["kernel_path"] == "int4pack_mm_cpu"
    assert exports["gguf"]["max_abs_deviation"] == 0.0 and (out / exports["gguf"]["folder"] / "model.gguf").is_file()
    assert (out / exports["gptq"]["folder"] / "quantize_config.json").is_file()
    refused = {e["to"]: e for e in records["nf4-b64"]["exports"]}
    assert records["nf4-b64"]["status"] == "ok" and "nearest" in refused["gguf"]["error"]
    assert "fp32" not in {r for r, rec in records.items() if rec.get("exports")}
    assert "exports/" in (out / "report.md").read_text()
    plain = tmp_path / "plain"
    plain.write_text("")  # the mode the umask gives an ordinary new file
    written = [f for f in (out / "exports").rglob("*") if f.is_file()]
    assert any(f.suffix == ".safetensors" for f in written)  # safetensors creates its files 0600 by itself
    assert {f.stat().st_mode & 0o777 for f in written} == {plain.stat().st_mode & 0o777}

    assert main(["export", str(out), "--variant", int4, "--to", "gguf", "--out", str(tmp_path / "again")]) == 0
    assert "as measured" in capsys.readouterr().err
    assert (tmp_path / "again" / "model.gguf").read_bytes() == (out / exports["gguf"]["folder"] / "model.gguf").read_bytes()


def test_export_refusals_are_one_line_errors(small_model_dir: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(Exception, match="export\\[0\\].variants"):
        validate_recipe({"name": "x", "model": {"path": str(small_model_dir)}, "weights": ["fp32"],
                         "export": [{"variants": ["int4"], "to": ["gguf"]}]})
    with pytest.raises(Exception, match="unknown export target 'onnx'"):
        validate_recipe({"name": "x", "model": {"path": str(small_model_dir)}, "weights": ["fp32"],
                         "export": [{"variants": ["fp32"], "to": ["onnx"]}]})
    assert main(["export", str(tmp_path), "--variant", "fp32", "--to", "gguf", "--out", str(tmp_path / "o")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
