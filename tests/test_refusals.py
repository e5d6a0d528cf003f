"""Inputs that used to run for minutes before failing (or succeeded misleadingly) are refused in one line, before
any work, naming the file, the field and what is allowed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from quantlab.cli import main


def _recipe(tmp_path: Path, **fields) -> Path:
    recipe = {"name": "r", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"], "device": "cpu",
              "workload": {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1,
                           "engine": "eager"}, **fields}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("quantlab: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_a_model_path_that_is_a_file_is_refused_naming_the_field(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    path = _recipe(tmp_path, model={"path": "config.json"})
    _refused(["run", str(path), "--out", str(tmp_path / "out")], capsys, f"{path}: model.path:",
             "is a file, not a model folder", "config: FILE with synthetic: true")
    assert not (tmp_path / "out").exists()


def test_a_gguf_file_as_model_path_says_how_to_name_it(tmp_path: Path, capsys) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    path = _recipe(tmp_path, model={"path": "m.gguf"})
    _refused(["run", str(path)], capsys, "model.path:", "gguf_file: m.gguf")


def test_an_empty_kv_cache_list_is_refused(tmp_path: Path, capsys) -> None:
    path = _recipe(tmp_path, kv_cache=[])
    _refused(["run", str(path), "--out", str(tmp_path / "out")], capsys, f"{path}: kv_cache: an empty list",
             "leave kv_cache out")


@pytest.mark.parametrize("content", ["", "  \n\n\t\n", '{"text": ""}\n{"text": "   "}\n'])
def test_an_empty_perplexity_text_is_refused(tmp_path: Path, capsys, content: str) -> None:
    name = "empty.jsonl" if content.startswith("{") else "empty.txt"
    (tmp_path / name).write_text(content)
    path = _recipe(tmp_path, evaluations={"perplexity": {"text": name}})
    _refused(["run", str(path), "--out", str(tmp_path / "out")], capsys, "evaluations.perplexity.text:",
             "holds no text")
    assert not (tmp_path / "out").exists()


def test_a_recipe_path_that_is_a_folder_says_so(tmp_path: Path, capsys) -> None:
    _refused(["run", str(tmp_path)], capsys, f"{tmp_path}: a folder, not a recipe file", "quantlab init")


def test_a_format_whose_extra_is_missing_is_refused_before_the_baseline_is_measured(
        tmp_path: Path, capsys, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] in ("gptqmodel", "optimum") else real(name, *a))
    path = _recipe(tmp_path, weights=["fp32", {"format": "gptqmodel", "bits": 4, "group_size": 32}])
    _refused(["run", str(path), "--out", str(tmp_path / "out")], capsys, "weights[1]:",
             "needs GPTQModel: pip install 'quantlab[gptq]'")
    path = _recipe(tmp_path, kv_cache=["native", {"format": "hf-quantized", "backend": "quanto", "bits": 4}])
    _refused(["run", str(path), "--out", str(tmp_path / "out")], capsys, "kv_cache[1]:", "pip install 'quantlab[kv]'")
    assert not (tmp_path / "out").exists()


def test_a_folder_holding_another_recipes_records_is_refused_naming_both(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    (out / "records").mkdir(parents=True)
    (out / "records" / "0123456789abcdef.json").write_text('{"recipe": "quickstart", "status": "ok"}')
    path = _recipe(tmp_path)
    _refused(["run", str(path), "--out", str(out)], capsys, "holds the records of recipe 'quickstart', not 'r'",
             "another --out", "--add")


def test_export_refusals_the_record_decides_come_before_the_model_loads(
        tmp_path: Path, capsys, monkeypatch) -> None:
    import json

    from quantlab import load_recipe
    from quantlab.run import lifecycle

    recipe = load_recipe(_recipe(tmp_path, weights=["fp32", "int8", "nf4"]))
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"recipe": recipe.to_spec()}))
    monkeypatch.setattr(lifecycle, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    _refused(["export", str(run), "--variant", "int8-pc-asym", "--to", "gguf", "--out", str(tmp_path / "x")], capsys,
             "int8-pc-asym: weight format int8-pc-asym cannot be written as gguf",
             "its numbers export to: compressed-tensors, gptq", "formats that export to gguf:", "int4")
    _refused(["export", str(run), "--variant", "nf4-b64", "--to", "gptq", "--out", str(tmp_path / "x")], capsys,
             "export to: no target")
    (tmp_path / "file").write_text("taken")
    _refused(["export", str(run), "--variant", "int8-pc-asym", "--to", "gptq", "--out", str(tmp_path / "file")],
             capsys, "--out", "an existing file, not a folder")


@pytest.mark.parametrize("spec", ["int8", {"format": "int8", "symmetric": True}, {"format": "int4", "group_size": 64},
                                  {"format": "int3", "group_size": 128}, "nf4", {"format": "hqq", "bits": 4},
                                  {"format": "fp8"}, {"format": "gguf", "type": "Q4_K"}])
def test_a_refusal_decided_from_the_config_agrees_with_the_exporter(spec, tmp_path: Path) -> None:
    """Where the config says a target cannot hold the format, writing the quantized model there is refused too,
    and where it says it can, the exporter's module check passes (the bundled model, every target)."""
    import torch

    from quantlab.errors import UnsupportedError
    from quantlab.models import ModelSpec, load_model
    from quantlab.quant import WEIGHT_FORMATS, quantize_
    from quantlab.quant.io import EXPORTERS
    from quantlab.quant.io.export import quantized_linears
    from quantlab.run.recipe import resolve_format

    fmt = resolve_format(WEIGHT_FORMATS, spec, "test", "w")
    model = load_model(ModelSpec(bundled="tiny-stdlib-llama"), torch.device("cpu"), 0).model
    quantize_(model, fmt)
    for to in EXPORTERS.names():
        exporter = EXPORTERS[to].build()
        try:
            linears = quantized_linears(model)
            late = next((p for lw in linears if (p := exporter.refusal(lw))), None)
            if late is None and exporter.one_setting and len({str(lw.settings) for lw in linears}) > 1:
                late = "one setting"
        except UnsupportedError as e:
            late = str(e)
        assert (fmt.export_refusal(to) is None) == (late is None), (fmt.label, to, fmt.export_refusal(to), late)
