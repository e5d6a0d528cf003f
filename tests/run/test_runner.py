import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quantlab import run_recipe, validate_recipe
from quantlab.extend import WEIGHT_FORMATS
from quantlab.files import read_jsonl
from quantlab.paths import BUNDLED_DIR
from tests.conftest import make_llama

CPU = torch.device("cpu")
WORKLOAD = {"batch_size": 1, "prompt_tokens": 16, "new_tokens": 4, "warmup_runs": 1, "prefill_repeats": 1, "engine": "eager"}


@pytest.fixture(scope="module")
def quickstart_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's path (bundled model) on fewer tokens, in this process (the CLI tests run a process per
    variant)."""
    recipe = validate_recipe({
        "name": "quickstart-slice",
        "model": {"bundled": "tiny-stdlib-llama"},
        "weights": ["fp32", "bf16", {"format": "int8"}, {"format": "int4", "group_size": 128}],
        "workload": WORKLOAD,
        "evaluations": {"perplexity": {"window_tokens": 256, "max_tokens": 1024}},
        "device": "cpu", "isolation": "none",
    })
    return run_recipe(recipe, tmp_path_factory.mktemp("run") / "out", log=lambda _: None)


def test_every_variant_is_measured_with_units_and_protocol(quickstart_slice: Path) -> None:
    rows = read_jsonl(quickstart_slice / "results.jsonl")
    assert [r["variant"] for r in rows] == ["fp32", "bf16", "int8-pc-asym", "int4-g128-asym"]
    for r in rows:
        assert r["status"] == "ok", r.get("error")
        assert r["weight_bytes"] == r["weight_bytes_analytic"]
        assert r["peak_memory_bytes"] > r["weight_bytes"]
        assert r["prefill_ms"] > 0 and 0 < r["decode_ms_p10"] <= r["decode_ms_per_token"] <= r["decode_ms_p90"]
        assert r["tokens_per_s"] == pytest.approx(1000 / r["decode_ms_per_token"], rel=1e-3)
        assert r["decode_steps"] == 4 and r["kv_format"] == "native" and r["device"].startswith("cpu")
        assert r["kv_cache_bytes"] == r["kv_cache_bytes_analytic"] > 0 and r["kv_cache_tokens"] == 20
        # What the config alone predicts (quantlab estimate) is what was measured, to the byte.
        assert r["weight_bytes_estimate"] == r["weight_bytes"] and r["kv_cache_bytes_estimate"] == r["kv_cache_bytes"]
        assert r["peak_memory_bytes"] == max(r["peak_prefill_bytes"], r["peak_decode_bytes"])
        assert 0 < r["roofline_share"] < 1 and r["decode_bytes_read_per_step"] > r["decode_weight_bytes_read"]
        proto = r["perplexity_protocol"]
        assert proto["name"] == "windows" and proto["scored_tokens"] == 4 * 255 and len(proto["text_sha256"]) == 64
        assert math.isfinite(r["perplexity"])
    kv = {r["variant"]: r["kv_cache_bytes"] for r in rows}
    assert kv["fp32"] == 2 * kv["bf16"]  # the native cache follows the compute dtype
    size = {r["variant"]: r["weight_bytes"] for r in rows}
    assert size["fp32"] > size["bf16"] > size["int8-pc-asym"] > size["int4-g128-asym"]
    ppl = {r["variant"]: r["perplexity"] for r in rows}
    assert ppl["int4-g128-asym"] > ppl["fp32"]
    assert abs(ppl["int8-pc-asym"] - ppl["fp32"]) < abs(ppl["int4-g128-asym"] - ppl["fp32"])


def test_report_and_csv_put_the_baseline_first(quickstart_slice: Path) -> None:
    report = (quickstart_slice / "report.md").read_text()
    summary, details = report.split("## Details")
    table = [ln for ln in summary.splitlines() if ln.startswith("| ") and "variant" not in ln]
    assert table[0].startswith("| fp32 (baseline)") and len(table) == 4
    table = [ln for ln in details.splitlines() if ln.startswith("| ") and "variant" not in ln]
    assert table[0].startswith("| fp32 | ok |") and len(table) == 4
    assert "windows: window 256, stride 256" in report
    assert "config estimate MiB" in report and "meta device" in report
    csv = (quickstart_slice / "results.csv").read_text().splitlines()
    assert len(csv) == 5 and "weight_bytes_ratio" in csv[0]
    assert json.loads((quickstart_slice / "manifest.json").read_text())["complete"] is True


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_report_is_rebuilt_from_results_jsonl(quickstart_slice: Path) -> None:
    before = (quickstart_slice / "report.md").read_text()
    page = (quickstart_slice / "report.html").read_text()
    (quickstart_slice / "report.md").unlink()
    (quickstart_slice / "results.csv").unlink()
    proc = subprocess.run([sys.executable, "-m", "quantlab.cli", "report", str(quickstart_slice)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (quickstart_slice / "report.md").read_text() == before
    assert (quickstart_slice / "report.html").read_text() == page  # plots included: same data, same bytes
    assert (quickstart_slice / "results.csv").is_file()


def _small_recipe(model_dir: Path, weights: list) -> dict:
    return {"name": "small", "model": {"path": str(model_dir)}, "weights": weights, "workload": WORKLOAD,
            "evaluations": {"perplexity": {"window_tokens": 64, "max_tokens": 512}}, "isolation": "none", "device": "cpu"}


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_per_module_mix_is_a_variant_whose_bytes_follow_each_module(small_model_dir: Path, tmp_path: Path) -> None:
    mixed = {"format": "int4", "group_size": 32, "overrides": [{"modules": "*.down_proj", "format": "int8"}]}
    recipe = validate_recipe(_small_recipe(small_model_dir, ["int8", {"format": "int4", "group_size": 32}, mixed]))
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    mix = rows["int4-g32-asym+int8-pc-asym@down_proj"]
    assert mix["status"] == "ok"
    assert rows["int4-g32-asym"]["weight_bytes"] < mix["weight_bytes"] < rows["int8-pc-asym"]["weight_bytes"]
    # The down projections (2 layers of 128x256) cost int8's bytes instead of int4-g32's.
    int4, int8 = WEIGHT_FORMATS["int4"].build(group_size=32), WEIGHT_FORMATS["int8"].build()
    extra = 2 * (int8.linear_weight_bytes(128, 256, None) - int4.linear_weight_bytes(128, 256, None))
    assert mix["weight_bytes"] - rows["int4-g32-asym"]["weight_bytes"] == extra


def test_a_failing_variant_is_recorded_and_the_run_goes_on(small_model_dir: Path, tmp_path: Path) -> None:
    unsupported = {"format": "int4", "group_size": 16, "compute_dtype": "bfloat16", "kernel": "int4pack_mm_cpu"}
    recipe = validate_recipe(_small_recipe(small_model_dir, ["fp32", unsupported, "int8"]))
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    failed = rows["int4-g16-asym-bf16-int4pack_mm_cpu"]
    assert failed["status"] == "failed" and "does not support 4-bit group 16" in failed["error"]
    assert rows["fp32"]["status"] == rows["int8-pc-asym"]["status"] == "ok"
    assert "**failed**: UnsupportedError" in (out / "report.md").read_text()


def test_a_variant_past_its_time_limit_is_stopped_and_recorded(small_model_dir: Path, tmp_path: Path) -> None:
    recipe = validate_recipe({**_small_recipe(small_model_dir, ["fp32", "int8"]), "isolation": "process",
                              "variant_timeout_s": 0.2})  # a worker cannot even import torch in 0.2 s
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = read_jsonl(out / "results.jsonl")
    assert [r["status"] for r in rows] == ["failed", "failed"]
    assert all(r["error"] == "timed out after 0.2 s (variant_timeout_s)" for r in rows)
    assert "timed out after 0.2 s" in (out / "report.md").read_text()


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_workers_progress_reaches_the_log_and_its_last_line_the_error(small_model_dir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTLAB_PROGRESS_INTERVAL_S", "0")  # a line per step (default: at most one per 30 s)
    unsupported = {"format": "int4", "group_size": 16, "compute_dtype": "bfloat16", "kernel": "int4pack_mm_cpu"}
    spec = {**_small_recipe(small_model_dir, ["fp32", unsupported]), "isolation": "process",
            "workload": {"batch_size": 1, "prompt_tokens": [4, 8], "new_tokens": 2, "warmup_runs": 0,
                         "prefill_repeats": 1, "engine": "eager"}}
    said: list[str] = []
    out = run_recipe(validate_recipe(spec), tmp_path / "out", log=said.append)
    assert any(line.startswith("progress: decode points (batch, prompt): 1/2 after") for line in said), said
    failed = [r for r in read_jsonl(out / "results.jsonl") if r["status"] == "failed"]
    assert len(failed) == 1 and "does not support 4-bit group 16" in failed[0]["error"]


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_a_second_run_skips_finished_variants(small_model_dir: Path, tmp_path: Path) -> None:
    recipe = validate_recipe(_small_recipe(small_model_dir, ["fp32", "int8"]))
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    first = read_jsonl(out / "results.jsonl")
    logs: list[str] = []
    run_recipe(recipe, out, log=logs.append)
    assert read_jsonl(out / "results.jsonl") == first
    assert sum("already measured" in m for m in logs) == 2


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_rows_measured_on_another_machine_are_measured_again(small_model_dir: Path, tmp_path: Path) -> None:
    # An example report copied from elsewhere must not pass for the user's own measurement.
    recipe = validate_recipe(_small_recipe(small_model_dir, ["fp32", "int8"]))
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    first = read_jsonl(out / "results.jsonl")
    record_path = out / "records" / f"{first[0]['variant_key']}.json"
    record = json.loads(record_path.read_text())
    record["fingerprint_id"], record["fingerprint"]["host"] = "0" * 16, "another-machine"
    record["memory_bandwidth_bytes_per_s"] = 1  # a figure that only this copy has
    record_path.write_text(json.dumps(record))
    logs: list[str] = []
    run_recipe(recipe, out, log=logs.append)
    assert any("started sweep 1" in m for m in logs)
    assert sum("already measured" in m for m in logs) == 1 and sum(": running" in m for m in logs) == 1
    rows = read_jsonl(out / "results.jsonl")
    assert {r["fingerprint_id"] for r in rows} == {first[1]["fingerprint_id"]}
    replaced = list((out / "records" / "replaced").iterdir())  # the other machine's record is kept aside, not lost
    assert len(replaced) == 1 and json.loads(replaced[0].read_text())["fingerprint"]["host"] == "another-machine"


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_derived_figures_come_from_the_rows_own_inputs(small_model_dir: Path, tmp_path: Path) -> None:
    recipe = validate_recipe(_small_recipe(small_model_dir, ["fp32"]))
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    row = read_jsonl(out / "results.jsonl")[0]
    record_path = next((out / "records").glob("*.json"))
    record = json.loads(record_path.read_text())
    record["memory_bandwidth_bytes_per_s"] = row["memory_bandwidth_bytes_per_s"] // 2
    record_path.write_text(json.dumps(record))
    assert subprocess.run([sys.executable, "-m", "quantlab.cli", "report", str(out)], capture_output=True).returncode == 0
    again = read_jsonl(out / "results.jsonl")[0]
    assert again["roofline_decode_ms"] == pytest.approx(2 * row["roofline_decode_ms"], rel=1e-3)
    assert again["roofline_share"] == pytest.approx(2 * row["roofline_share"], abs=2e-4)  # both rounded to 4 places
    assert f"{record['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s" in (out / "report.md").read_text()


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_array_job_shards_cover_every_variant_once(small_model_dir: Path, tmp_path: Path) -> None:
    from quantlab.run.sweep import shard_of

    recipe = validate_recipe({**_small_recipe(small_model_dir, ["fp32", "bf16", "int8", {"format": "int4", "group_size": 64},
                                                                 {"format": "int4", "group_size": 32}]), "evaluations": {}})
    keys = {v.label: v.key for v in recipe.variants()}
    out = tmp_path / "shared"
    ran: list[list[str]] = []
    for i in range(3):  # as three array tasks would, one after another or at once
        logs: list[str] = []
        run_recipe(recipe, out, log=logs.append, shard=(i, 3))
        ran.append([m.split("] ")[1].removesuffix(": running") for m in logs if m.endswith(": running")])
        assert all(shard_of(keys[label], 3) == i for label in ran[-1])
        complete = json.loads((out / "manifest.json").read_text())["complete"] if (out / "manifest.json").exists() else False
        assert complete == (i >= max(shard_of(k, 3) for k in keys.values()))  # once the last shard with work is done
    assert sorted(label for share in ran for label in share) == sorted(keys)  # every variant, once
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 5 and all(r["status"] == "ok" for r in rows)
    assert (out / "sweeps" / "0.complete").exists()
    assert shard_of("00000000000000ff", 4) == 3 and shard_of("0000000000000100", 4) == 0  # a stable hash, not Python's


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_model_offloaded_to_disk_runs_with_the_figures_of_the_whole_model(tmp_path: Path) -> None:
    def run(model: dict, out: str) -> dict:
        recipe = validate_recipe({"name": "offload", "model": {"bundled": "tiny-stdlib-llama", **model},
                                  "weights": ["fp32", {"format": "int4", "group_size": 128}], "workload": WORKLOAD,
                                  "evaluations": {"perplexity": {"window_tokens": 256, "max_tokens": 2048}},
                                  "isolation": "none", "device": "cpu"})
        return {r["variant"]: r for r in read_jsonl(run_recipe(recipe, tmp_path / out, log=lambda _: None) / "results.jsonl")}

    whole = run({}, "whole")
    placed = run({"device_map": "auto", "max_memory": {"cpu": "12MB"}}, "placed")
    for variant, r in placed.items():
        assert r["status"] == "ok", r.get("error")
        assert r["perplexity"] == whole[variant]["perplexity"] and r["kernel_path"] == whole[variant]["kernel_path"]
        assert "disk" in r["device_map"].values() and "device_map" not in whole[variant]
        held = r["weight_bytes_by_device"]
        assert held["cpu"] == r["weight_bytes"] and held["cpu"] + held["offload:disk"] >= whole[variant]["weight_bytes"] - 1
    assert "model.embed_tokens" in placed["fp32"]["device_map"]


def test_synthetic_model_runs_latency_and_memory(small_model_dir: Path, tmp_path: Path) -> None:
    recipe = validate_recipe({
        "name": "synthetic", "model": {"config": str(small_model_dir / "config.json"), "synthetic": True},
        "weights": ["fp32", {"format": "int4", "group_size": 64}], "workload": WORKLOAD, "isolation": "none",
    })
    rows = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert "perplexity" not in rows[0] and rows[1]["weight_bytes"] < rows[0]["weight_bytes"]


@pytest.mark.slow
def test_gptq_beats_rtn_on_the_bundled_model(tmp_path: Path) -> None:
    """The GPTQ paper's shape on the bundled model: closer to fp32 than RTN at 3 bits, per channel and g128, where
    RTN loses 2.6 and 1.2 perplexity. (At 4 bits per channel RTN is within 0.3% of fp32 on this model, and
    GPTQ's result there, 0.1-0.3% either way with the calibration order, says nothing.)"""
    recipe = validate_recipe({
        "name": "gptq-vs-rtn", "model": {"bundled": "tiny-stdlib-llama"},
        "weights": ["fp32", {"format": "int3"}, {"format": "gptq", "bits": 3},
                    {"format": "int3", "group_size": 128}, {"format": "gptq", "bits": 3, "group_size": 128}],
        "workload": {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
        "evaluations": {"perplexity": {"window_tokens": 256, "max_tokens": 16384}},
        "calibration": {"samples": 32, "seq_len": 256}, "isolation": "none", "device": "cpu",
    })
    rows = {r["variant"]: r for r in read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")}
    gap = {k: r["perplexity"] - rows["fp32"]["perplexity"] for k, r in rows.items()}
    assert 0 < gap["int3-pc-asym-gptq"] < 0.5 * gap["int3-pc-asym"]
    assert 0 < gap["int3-g128-asym-gptq"] < 0.5 * gap["int3-g128-asym"]


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_gptq_layer_error_is_below_rtn_for_every_layer_of_the_bundled_model() -> None:
    import torch

    from quantlab import quantize_
    from quantlab.data import calibration_samples, load_text
    from quantlab.eval.tokens import tokenize
    from quantlab.extend import WEIGHT_FORMATS
    from quantlab.models import load_model
    from quantlab.run.recipe import ModelSpec

    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"))
    ids = tokenize(loaded.tokenizer, load_text("bundled-heldout"))  # any text: errors are on these inputs
    report = quantize_(loaded.model, WEIGHT_FORMATS["gptq"].build(bits=3, group_size=128),
                       calibration_samples(ids, 16, 256, seed=0))
    assert len(report.details) == 6 * 7
    for name, d in report.details.items():
        assert d["output_error_gptq"] <= d["output_error_rtn"], name
    assert torch.isfinite(torch.tensor([d["output_error_gptq"] for d in report.details.values()])).all()


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_every_batch_and_context_length_is_a_measurement_point(small_model_dir: Path, tmp_path: Path) -> None:
    recipe = validate_recipe({**_small_recipe(small_model_dir, ["fp32", "int8"]),
                              "workload": {**WORKLOAD, "batch_size": [1, 2], "prompt_tokens": [8, 32]}})
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = read_jsonl(out / "results.jsonl")
    for r in rows:
        points = [(p["batch_size"], p["prompt_tokens"]) for p in r["decode_points"]]
        assert points == [(1, 8), (1, 32), (2, 8), (2, 32)]
        kv = {(p["batch_size"], p["prompt_tokens"]): p["kv_cache_bytes"] for p in r["decode_points"]}
        assert kv[(2, 32)] == 2 * kv[(1, 32)] and kv[(1, 32)] * (8 + 4) == kv[(1, 8)] * (32 + 4)
        assert all(p["kv_cache_bytes"] == p["kv_cache_bytes_analytic"] and "roofline_share" in p for p in r["decode_points"])
        assert (r["batch_size"], r["prompt_tokens"]) == (1, 8)
    assert len((out / "results.csv").read_text().splitlines()) == 1 + 2 * 4
    assert "## Decode by batch size and context length" in (out / "report.md").read_text()


@pytest.mark.slow
def test_the_default_engine_compiles_where_it_can_and_says_why_not_elsewhere(small_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    # engine: auto (the default): a quantized KV format runs compiled over its static cache; transformers'
    # QuantizedCache has none, so its variant decodes eagerly, with the reason in engine_options.
    workload = {k: v for k, v in WORKLOAD.items() if k != "engine"}
    recipe = validate_recipe({**_small_recipe(small_model_dir, ["fp32"]), "evaluations": {}, "workload": workload,
                              "kv_cache": [{"format": "int4", "group_size": 32, "residual_tokens": 4},
                                           {"format": "hf-quantized", "backend": "quanto", "residual_tokens": 4}]})
    assert recipe.workload.engine == "auto"
    rows = {r["kv_format"]: r for r in read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None)
                                                 / "results.jsonl")}
    packed, theirs = rows["int4-g32-r4"], rows["hf-quanto-int4-g64-r4"]
    assert packed["status"] == "ok" and packed["engine"] == "compiled"
    assert packed["engine_options"]["engine_choice"] == "auto: compiled"
    assert packed["engine_options"]["attention"] == "quantlab-fused"
    assert packed["kv_cache_bytes"] == packed["kv_cache_bytes_analytic"]  # the static layout's formula
    assert theirs["status"] == "ok" and theirs["engine"] == "eager"
    assert "has no static cache" in theirs["engine_options"]["engine_choice"]


def test_compiled_engine_decodes_over_a_static_cache(small_model_dir: Path, tmp_path: Path) -> None:
    import torch._inductor.config as inductor

    recipe = validate_recipe({**_small_recipe(small_model_dir, ["fp32"]), "evaluations": {},
                              "workload": {**WORKLOAD, "engine": "compiled"}})
    before = inductor.get_config_copy()
    row = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")[0]
    assert inductor.get_config_copy() == before  # the engine's inductor settings were scoped to its run
    assert row["status"] == "ok", row.get("error")
    assert row["engine"] == "compiled" and row["engine_options"]["mode"] in ("default", "reduce-overhead")
    assert row["kv_cache_bytes"] == row["kv_cache_bytes_analytic"]  # the static cache holds prompt + new tokens
    assert "engine `compiled`" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.gpu
def test_a_recipe_runs_on_cuda_through_the_fast_kernels(small_model_dir: Path, tmp_path: Path) -> None:
    weights = ["bf16", {"format": "int8", "compute_dtype": "bfloat16"},
               {"format": "int4", "group_size": 64, "compute_dtype": "bfloat16"}]
    recipe = validate_recipe({**_small_recipe(small_model_dir, weights), "device": "cuda"})
    rows = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")
    assert [r["status"] for r in rows] == ["ok"] * 3, [r.get("error") for r in rows]
    bf16, int8, int4 = rows
    assert [r["kernel_path"] for r in rows] == ["dense", "int8_cast_mm", "int4_tinygemm_cuda"]
    assert bf16["weight_bytes"] > int8["weight_bytes"] > int4["weight_bytes"]
    assert all(r["weight_bytes"] == r["weight_bytes_analytic"] for r in rows)
    assert all("max_memory_allocated" in r["peak_memory_method"] for r in rows)
    assert all(0 < r["roofline_share"] <= 1.0 for r in rows)
    assert abs(int8["perplexity"] / bf16["perplexity"] - 1) < 0.01


DETERMINISTIC = ("variant", "variant_key", "status", "weight_bytes", "weight_bytes_analytic", "weight_bytes_estimate",
                 "kv_cache_bytes", "perplexity", "kernel_path")


def _cli_recipe(model_dir: Path, tmp_path: Path) -> Path:
    import yaml

    recipe = _small_recipe(model_dir, ["fp32", {"format": "int4", "group_size": 64}])
    recipe["isolation"] = "process"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _run_cli(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantlab.cli", "run", str(recipe), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)


def _kept(rows: list[dict]) -> list[tuple]:
    return [tuple(r.get(k) for k in DETERMINISTIC) for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    recipe = _cli_recipe(small_model_dir, folder)
    done = _run_cli(recipe, folder / "out")
    assert done.returncode == 0, done.stderr
    return recipe, read_jsonl(folder / "out" / "results.jsonl")


@pytest.mark.slow  # end to end (two runs, a kill and a resume); CI's slow tier runs it
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT"])
def test_an_interrupted_run_resumes_to_the_rows_of_an_uninterrupted_one(
    uninterrupted: tuple[Path, list[dict]], tmp_path: Path, signal_name: str
) -> None:
    import os
    import signal
    import time

    recipe, expected = uninterrupted

    out = tmp_path / "interrupted"
    # The run starts with Ctrl-C's default action, as from a shell, whatever this test process inherited or set.
    proc = subprocess.Popen([sys.executable, "-m", "quantlab.cli", "run", str(recipe), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not list((out / "claims").glob("*.json")) or len(list((out / "records").glob("*.json"))) < 1:
        assert time.monotonic() < deadline, "the first variant never finished"
        time.sleep(0.2)  # the first variant is done and the second claimed
    os.killpg(proc.pid, getattr(signal, signal_name))  # the whole group, as Ctrl-C or a kill would
    _, stderr = proc.communicate(timeout=120)
    partial = [json.loads(p.read_text()) for p in (out / "records").glob("*.json")]
    assert len(partial) == 1 and partial[0]["status"] == "ok", (  # killed while the second variant ran
        proc.returncode, signal.getsignal(signal.SIGINT), stderr[-1500:])
    assert json.loads((out / "manifest.json").read_text())["complete"] is False
    left = list((out / "claims").glob("*.json"))
    if signal_name == "SIGINT":
        assert proc.returncode == 130 and "run the same command again to resume" in stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr  # one line, no worker's
        assert stderr.strip().splitlines()[-1] == "quantlab: interrupted; run the same command again to resume"
        assert left == []  # an interrupted process gives its claim back
    else:
        assert len(left) == 1  # a killed one cannot: its claim stays, with a dead owner

    resumed = _run_cli(recipe, out)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("already measured, skipped") == len(partial)
    rows = read_jsonl(out / "results.jsonl")
    assert len({r["variant_key"] for r in rows}) == len(rows) == 2  # no lost rows, no duplicates
    assert _kept(rows) == _kept(expected)
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert list((out / "claims").glob("*.json")) == []


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_two_concurrent_runs_share_the_variants_and_measure_each_once(small_model_dir: Path, tmp_path: Path) -> None:
    import yaml

    recipe = _small_recipe(small_model_dir, ["fp32", "bf16", "int8", {"format": "int4", "group_size": 64}])
    recipe.update(isolation="process", evaluations={})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "shared"
    procs = [subprocess.Popen([sys.executable, "-m", "quantlab.cli", "run", str(path), "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    ran = [line.split("]")[1].split(":")[0].strip() for log in logs for line in log.splitlines() if line.endswith(": running")]
    assert sorted(ran) == sorted(["fp32", "bf16", "int8-pc-asym", "int4-g64-asym"])  # each measured exactly once
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == len({r["variant_key"] for r in rows}) == 4 and all(r["status"] == "ok" for r in rows)
    assert not (out / "records" / "replaced").exists()  # nobody rewrote anybody's record
    assert len(list((out / "sweeps").glob("*.json"))) == 1  # both filled one sweep
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_calibrated_format_is_solved_once_for_all_its_kv_formats(tmp_path: Path) -> None:
    """GPTQ paired with two KV formats: the first variant solves and keeps the model in the run folder, the second
    (another worker process) loads it; the weights are the same, and the kept copy goes when the run completes."""
    from quantlab.run.lifecycle import shared_weights_path

    spec = {"name": "solve-once", "model": {"bundled": "tiny-stdlib-llama"},
            "weights": [{"format": "gptq", "bits": 4, "group_size": 128}],
            "kv_cache": ["native", {"format": "int8", "group_size": 32, "residual_tokens": 0}],
            "workload": WORKLOAD,  # windows never read the cache: the same weights give the same perplexity
            "evaluations": {"perplexity": {"protocol": "windows", "window_tokens": 128, "max_tokens": 512}},
            "calibration": {"samples": 4, "seq_len": 128}, "device": "cpu"}
    uncalibrated = validate_recipe({**spec, "weights": ["int8"]})
    assert shared_weights_path(uncalibrated, uncalibrated.variants()[0], CPU, tmp_path) is None  # nothing to solve
    recipe = validate_recipe(spec)
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = read_jsonl(out / "results.jsonl")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    sources = sorted((r["weights_source"] for r in rows), key=lambda s: "reused" in s)
    assert sources[0]["quantized"] == "here" and sources[0]["saved"].startswith("weights/")
    assert sources[1]["reused"] == sources[0]["saved"] and sources[1]["by_variant"] in {r["variant"] for r in rows}
    records = [json.loads(f.read_text()) for f in (out / "records").glob("*.json")]
    perplexities = {r["measurements"]["perplexity"]["perplexity"] for r in records}
    assert rows[0]["weight_bytes"] == rows[1]["weight_bytes"] and len(perplexities) == 1
    assert not (out / "weights").exists()


@pytest.mark.slow  # two runs in fresh processes: CI's slow tier
def test_threads_from_the_recipe_or_the_cli_reach_the_measuring_process_and_are_recorded(tmp_path: Path) -> None:
    from quantlab import RecipeError

    before = torch.get_num_threads()
    recipe = validate_recipe({"name": "threads", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                              "workload": WORKLOAD, "device": "cpu"}).with_threads(1)
    rows = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")
    assert rows[0]["status"] == "ok" and rows[0]["threads"] == 1 and rows[0]["device"] == "cpu (1 threads)"
    assert rows[0]["concurrent_timed_runs"] == 0 and 0 < rows[0]["process_cpu_share"] <= 1.05
    assert torch.get_num_threads() == before  # the caller's setting is restored
    with pytest.raises(RecipeError, match="--threads: a positive number of threads, not 0"):
        recipe.with_threads(0)


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_each_variant_compares_the_copy_bandwidth_after_it_with_one_measured_just_before_it(
        small_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import quantlab.run.sweep as sweep

    readings = iter(range(10**10, 2 * 10**10, 10**9))  # 10, 11, 12, ... GB/s: every reading differs
    monkeypatch.setattr(sweep, "copy_bandwidth_bytes_per_s", lambda device: float(next(readings)))
    recipe = validate_recipe(_small_recipe(small_model_dir, ["fp32", "int8"]))
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = sorted(read_jsonl(out / "results.jsonl"), key=lambda r: r["memory_bandwidth_bytes_per_s"])
    pairs = [(r["memory_bandwidth_bytes_per_s"] // 10**9, r["memory_bandwidth_after_bytes_per_s"] // 10**9) for r in rows]
    assert pairs == [(10, 11), (12, 13)]  # the second variant's "before" is its own, not the sweep's first reading


MICROSCALING_WEIGHTS = ["fp32", "mxfp4", "nvfp4", "mxfp8", {"format": "fp8", "block_size": 128},
                        {"format": "nvfp4", "activations": "nvfp4"}, {"format": "fp8", "activations": "fp8"}]
MICROSCALING_KV = ["native", "nvfp4", {"format": "int4", "group_size": 32, "residual_tokens": 8, "rotate": "hadamard"}]


def _microscaling_rows(model_dir: Path, device: str, tmp_path: Path) -> dict[str, dict]:
    recipe = validate_recipe({
        "name": "microscaling-devices", "model": {"path": str(model_dir), "dtype": "float32"},
        "weights": MICROSCALING_WEIGHTS, "kv_cache": MICROSCALING_KV, "workload": WORKLOAD, "device": device,
        "evaluations": {"perplexity": {"protocol": "kv-chunked", "window_tokens": 128, "chunk_tokens": 32,
                                       "max_tokens": 512, "text": "bundled-heldout"},
                        "divergence": {"max_tokens": 512}},
        "isolation": "none", "baseline": "fp32/kv-native"})
    rows = read_jsonl(run_recipe(recipe, tmp_path / device, log=lambda _: None) / "results.jsonl")
    return {r["variant"]: r for r in rows}


@pytest.mark.gpu
def test_the_microscaling_formats_measure_on_cuda_what_they_measure_on_cpu(tmp_path: Path) -> None:
    """Weights MXFP4/NVFP4/MXFP8/block FP8 (weight-only and with rounded activations) and KV NVFP4 and rotated int4
    run on CUDA with the bytes CPU holds and, in float32, the same perplexity and divergence (rounding codes on
    either device is the same arithmetic; only the matmuls' summation order differs)."""
    model_dir = tmp_path / "model"  # heads of 64: the rotated cache's Hadamard size
    make_llama(hidden_size=256, intermediate_size=512, num_attention_heads=4).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BUNDLED_DIR / "tiny-stdlib-llama" / name, model_dir / name)
    cpu, cuda = _microscaling_rows(model_dir, "cpu", tmp_path), _microscaling_rows(model_dir, "cuda", tmp_path)
    assert cuda.keys() == cpu.keys() and len(cuda) == len(MICROSCALING_WEIGHTS) * len(MICROSCALING_KV)
    assert all(r["status"] == "ok" for r in cuda.values()), {k: r.get("error") for k, r in cuda.items()}
    for name, row in cuda.items():
        want = cpu[name]
        for field in ("weight_bytes", "weight_bytes_analytic", "kv_cache_bytes", "kv_cache_bytes_analytic"):
            assert row[field] == want[field], (name, field)
        assert row["perplexity"] == pytest.approx(want["perplexity"], rel=2e-3), name
        if want.get("kl_divergence_mean") is not None:  # the divergence rows (teacher-forced: native cache)
            assert row["kl_divergence_mean"] == pytest.approx(want["kl_divergence_mean"], rel=0.05, abs=1e-5), name
    kl = {name.split("/")[0]: row["kl_divergence_mean"] for name, row in cuda.items() if name.endswith("/kv-native")}
    assert kl["fp32"] == 0 and kl["mxfp8"] < kl["mxfp4"] and kl["nvfp4"] < kl["nvfp4-anvfp4"]
