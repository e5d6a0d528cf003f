import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantlab.cli import main


def test_formats_lists_every_registered_format_protocol_executor_and_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    from quantlab.extend import EXECUTORS, KERNELS, KV_FORMATS, PERPLEXITY_PROTOCOLS, WEIGHT_FORMATS

    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for name in WEIGHT_FORMATS.names() + KV_FORMATS.names() + PERPLEXITY_PROTOCOLS.names() + EXECUTORS.names():
        assert f"  {name} " in out
    listed = [line.split()[0] for line in out.split("matmul kernels")[1].splitlines()[1:]]
    assert listed == KERNELS.names() and listed[-1] == "dequantize+matmul"


def test_formats_with_kernels_shows_a_cpu_path_other_than_dequantize_for_every_stored_format(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["formats", "--kernels"]) == 0
    lines = [line for line in capsys.readouterr().out.split("KV-cache formats:")[0].splitlines() if "CPU kernel:" in line]
    paths = {line.split()[0]: line.split("CPU kernel: ")[1] for line in lines}
    assert paths["nf4"] == paths["fp4"] == "lut4_cpu" and paths["fp8"] == "fp8_cpu"
    assert paths["int4"] == paths["hqq"] == "int4pack_mm_cpu" and paths["int3"] == "bitplane_cpu"
    assert not any("dequantize+matmul" in p for p in paths.values())


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


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantlab.cli", *argv], capture_output=True, text=True, timeout=600)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess:
    """``quantlab ARGV`` in this process (the refusals' path without a fresh interpreter's imports)."""
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, captured.out, captured.err)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("quantlab: error: ") and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in last, (needle, last)


def _recipe(tmp_path: Path, **fields) -> Path:
    recipe = {"name": "r", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"], "device": "cpu",
              "workload": {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"}, **fields}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_an_output_path_that_is_a_file_is_refused_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "taken"
    target.write_text("not a folder")
    proc = _main(capsys, "run", str(_recipe(tmp_path)), "--out", str(target))
    _one_line_error(proc, str(target), "existing file")
    assert "memory bandwidth" not in proc.stderr  # nothing was measured


def test_an_output_folder_that_cannot_be_written_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = Path("/proc/quantlab-out")  # even root cannot make a folder there
    _one_line_error(_main(capsys, "run", str(_recipe(tmp_path)), "--out", str(target)), "cannot write the output folder")


@pytest.mark.parametrize("fields,where", [
    ({"workload": {"prompt_tokens": 1100, "new_tokens": 8}}, "workload.prompt_tokens: 1100 + new_tokens 8 = 1108"),
    pytest.param({"evaluations": {"perplexity": {"window_tokens": 2048}}}, "evaluations.perplexity.window_tokens: 2048",
                 marks=pytest.mark.slow),  # the same check through a fresh interpreter: once in the default run
])
def test_lengths_beyond_the_position_limit_are_refused_with_the_limit_and_its_source(tmp_path: Path, fields: dict, where: str) -> None:
    path = _recipe(tmp_path, **fields)
    proc = _cli("run", str(path), "--out", str(tmp_path / "out"))
    _one_line_error(proc, f"{path}: {where}", "position limit 1024", "max_position_embeddings")
    assert not (tmp_path / "out").exists()  # refused before anything was measured or written
    assert proc.stderr.strip().count("\n") == 0  # the one line only: no other package's import-time notices


@pytest.mark.slow  # a fresh interpreter that loads and fails a variant: CI's slow tier
def test_a_failed_variant_makes_the_run_exit_1_with_the_report_written(tmp_path: Path, small_model_dir: Path) -> None:
    unsupported = {"format": "int4", "group_size": 16, "compute_dtype": "bfloat16", "kernel": "int4pack_mm_cpu"}
    path = _recipe(tmp_path, model={"path": str(small_model_dir)}, weights=[unsupported], isolation="none")
    proc = _cli("run", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr
    assert "1 of 1 variants failed" in proc.stderr.strip().splitlines()[-1]
    assert "**failed**" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("damage, needle", [
    ("missing", "no weights (model.safetensors"),
    ("truncated", "model.safetensors: not a readable safetensors file (Error while deserializing header: incomplete"),
    ("garbage", "model.safetensors: not a readable safetensors file"),
    ("shard", "model.safetensors.index.json names model-00002-of-00002.safetensors, which is not in"),
])
def test_weights_that_cannot_be_read_are_refused_at_the_first_load_naming_the_file(
        tmp_path: Path, small_model_dir: Path, capsys: pytest.CaptureFixture[str], damage: str, needle: str) -> None:
    broken = tmp_path / "model"
    shutil.copytree(small_model_dir, broken)
    weights = broken / "model.safetensors"
    if damage == "missing":
        weights.unlink()
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(bytes(range(256)) * 64)
    else:
        (broken / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    path = _recipe(tmp_path, model={"path": str(broken)})
    _main_error(["run", str(path), "--out", str(tmp_path / "out")], capsys, f"{path}: model.path: ", needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_compare_warns_about_runs_with_different_workloads(tmp_path: Path) -> None:
    from report.conftest import make_row, write_run

    a = write_run(tmp_path / "a", "short", [make_row("fp32", 19.0, 58.5, 4.0)])
    b = write_run(tmp_path / "b", "long", [make_row("fp32", 19.0, 58.5, 4.0)])
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["recipe"]["workload"]["prompt_tokens"] = 1100
    (b / "manifest.json").write_text(json.dumps(manifest))
    proc = _cli("compare", str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "workload.prompt_tokens differs: [1] 16; [2] 1100" in warnings[0]
    assert "workload.prompt_tokens differs" in (tmp_path / "cmp" / "compare.md").read_text()


@pytest.mark.parametrize("shard", ["3/3", "a/2", "1", "2/0"])
def test_a_bad_shard_is_one_line_exit_2(tmp_path: Path, shard: str, capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_error(_main(capsys, "run", str(_recipe(tmp_path)), "--shard", shard), "--shard: expected I/N with 0 <= I < N")


def test_estimate_notes_positions_beyond_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(CONFIGS / "gpt2.json"), "--seq-len", "4096"]) == 0
    assert "4,096 positions exceed the position limit max_position_embeddings = 1,024" in capsys.readouterr().out


def _main_error(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("quantlab: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("fields, needles", [
    ({"weights": [{"format": "int8", "overrides": [{"modules": "*.nothing", "format": "int4"}]}]},
     ["weights[0].overrides[0].modules: '*.nothing' matches no linear module", "model.layers.0.self_attn.q_proj"]),
    ({"weights": [{"format": "int4", "exclude": ["*.o_prj"]}]}, ["weights[0].exclude[0]: '*.o_prj' matches no"]),
    ({"weights": [{"format": "mixed", "candidates": ["int8", {"format": "int4", "group_size": 128}],
                   "budget_bytes": 1000}]},
     ["weights[0].budget_bytes: the budget of 1,000 bytes is below the smallest possible total"]),
    ({"kv_cache": ["native", {"format": "int4", "group_size": 32, "residual_tokens": 1000}]},
     ["kv_cache[1].residual_tokens: 1000 recent positions kept in full precision, but the run holds at most 10"]),
    pytest.param({"evaluations": {"lm_eval_tasks": [{"task": "stdlib_continuaton", "include_path": "EVALS"}]}},
                 ["evaluations.lm_eval_tasks[0].task: no task 'stdlib_continuaton'", "did you mean 'stdlib_continuation'"],
                 marks=pytest.mark.slow),  # lm-eval's task index takes seconds to build

])
def test_a_recipe_that_cannot_apply_to_its_model_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict, needles: list[str]) -> None:
    if "evaluations" in fields:
        pytest.importorskip("lm_eval")
        fields["evaluations"]["lm_eval_tasks"][0]["include_path"] = str(Path(__file__).parents[1] / "evals"
                                                                         / "stdlib_continuation")
    path = _recipe(tmp_path, **fields)
    _main_error(["run", str(path), "--out", str(tmp_path / "out")], capsys, f"{path}: ", *needles)
    assert not (tmp_path / "out").exists()


def test_a_key_given_twice_or_a_file_that_is_not_utf8_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text("name: a\nmodel: {bundled: tiny-stdlib-llama}\nweights: [fp32]\nname: b\n")
    _main_error(["run", str(twice)], capsys, f"{twice}: line 4: 'name' is given twice in one mapping (lines 1 and 4)")
    nested = tmp_path / "nested.yaml"
    nested.write_text("name: a\nmodel: {bundled: tiny-stdlib-llama}\nweights:\n  - {format: int4, bits: 4, bits: 3}\n")
    _main_error(["run", str(nested)], capsys, "line 4: 'bits' is given twice")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    _main_error(["run", str(latin)], capsys, f"{latin}: not UTF-8 text (byte 9")


def test_a_report_into_a_folder_it_cannot_write_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import quantlab.report

    def refuse(folder: Path, log=None) -> Path:  # as a read-only folder answers (root is never refused)
        raise PermissionError(13, "Permission denied", str(folder / "report.md"))

    monkeypatch.setattr(quantlab.report, "write_report", refuse)
    _main_error(["report", str(tmp_path)], capsys, f"{tmp_path}: cannot write the views there (Permission denied")


def test_a_ray_client_address_without_the_client_extra_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    try:
        import grpc  # noqa: F401  (with Ray's client extra the address would be tried)
        pytest.skip("Ray's client extra is installed")
    except ImportError:
        pass
    path = _recipe(tmp_path)
    _main_error(["run", str(path), "--out", str(tmp_path / "out"), "--executor", "ray", "--address",
                 "ray://127.0.0.1:1"], capsys, "--address ray://127.0.0.1:1: a ray:// address needs Ray's client")
    assert not (tmp_path / "out").exists()


def test_a_json_that_is_no_model_config_is_refused_by_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"hello": "world", "layers": "many"}))
    _main_error(["estimate", str(odd), "--seq-len", "128"], capsys, f"{odd}: no model fields")


def test_cuda_on_a_machine_without_one_is_refused_naming_the_field_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    path = _recipe(tmp_path, device="cuda")
    _main_error(["run", str(path), "--out", str(tmp_path / "out")], capsys, f"{path}: device: cuda, but torch sees no CUDA")
    assert not (tmp_path / "out").exists()
