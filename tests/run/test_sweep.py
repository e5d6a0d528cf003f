"""A sweep's share of the work: timing only the rows flagged noisy again (``--retime``), and waiting for a twin's
calibrated weights instead of solving them a second time."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantlab.records.claims import Claims
from quantlab.records.folder import RunFolder
from quantlab.run.lifecycle import shared_weights_path
from quantlab.run.recipe import validate_recipe
from quantlab.run.runner import run_recipe
from quantlab.run.sweep import Retime, Sweep, noisy_earlier, to_time_again

WORKLOAD = {"prompt_tokens": 8, "new_tokens": 4, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"}


@pytest.mark.slow  # three runs of a recipe: CI's slow tier
def test_retime_measures_only_the_noisy_rows_timing_again_and_keeps_their_other_figures(tmp_path: Path) -> None:
    recipe = validate_recipe({"name": "retime", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32", "int8"],
                              "workload": WORKLOAD, "isolation": "none", "device": "cpu",
                              "evaluations": {"perplexity": {"window_tokens": 64, "max_tokens": 256}}})
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    folder = RunFolder(out)
    fp32, int8 = (v.key for v in recipe.variants())
    quiet = folder.read_record(fp32)  # timed on a quiet machine, whatever load the test run itself met
    quiet["points"][0]["measurements"]["latency"].update(threads=2, load_average_1m=0.0, process_cpu_share=1.0,
                                                         concurrent_timed_runs=0)
    quiet["memory_bandwidth_after_bytes_per_s"] = None  # the copy bandwidth is measured around the whole variant
    latency = quiet["points"][0]["measurements"]["latency"]
    if latency.get("decode_ms_p10"):
        latency["decode_ms_p90"] = latency["decode_ms_p10"]
    folder.write_record(quiet)
    assert not noisy_earlier(folder.read_record(fp32), quiet["sweep"] + 1)
    busy = folder.read_record(int8)
    busy["points"][0]["measurements"]["latency"].update(threads=2, load_average_1m=7.5)  # as a busy machine leaves it
    folder.write_record(busy)
    quiet_before = folder.record_path(fp32).read_text()
    assert noisy_earlier(busy, busy["sweep"] + 1) and not noisy_earlier(busy, busy["sweep"])

    logs: list[str] = []
    run_recipe(recipe, out, log=logs.append, retime=True)
    assert any(line.endswith("int8-pc-asym: timing again (flagged noisy)") for line in logs), logs
    assert any("fp32: already measured, skipped" in line for line in logs), logs
    assert folder.record_path(fp32).read_text() == quiet_before  # the quiet row is untouched
    again = folder.read_record(int8)
    assert again["retimed"] == {"first_started_at": busy["started_at"], "first_sweep": busy["sweep"]}
    assert again["measurements"] == busy["measurements"]  # perplexity, weights: kept as first measured
    latency = again["points"][0]["measurements"]["latency"]
    assert latency.get("load_average_1m") != 7.5 and latency["decode_steps"] == 4
    assert len(list(folder.replaced_dir.glob(f"{int8}.*.json"))) == 2  # the edited record and the noisy one, kept
    still_noisy = noisy_earlier(again, again["sweep"] + 1)  # the tiny model's timing may be noisy again here
    logs.clear()
    run_recipe(recipe, out, log=logs.append, retime=True)
    assert any("timing again" in line for line in logs) == still_noisy


def _record(sweep: int, noisy: list[bool], status: str = "ok") -> dict:
    points = [{"batch_size": 1, "prompt_tokens": 8, "measurements": {}, "noisy": n} for n in noisy]
    return {"status": status, "sweep": sweep, "measurements": {}, "points": points}


def test_retime_all_times_every_earlier_measured_row_and_noisy_only_the_flagged(monkeypatch) -> None:
    from quantlab.run import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "flat_row", lambda record: {"decode_points": record["points"]})
    quiet, busy, none = _record(3, [False, False]), _record(3, [False, True]), _record(3, [])
    assert [to_time_again(r, 4, "noisy") for r in (quiet, busy, none)] == [False, True, False]
    assert [to_time_again(r, 4, "all") for r in (quiet, busy, none)] == [True, True, False]
    for which in ("noisy", "all"):  # never a row of this sweep (timed once a run), a failed row or a missing one
        assert not to_time_again(busy, 3, which) and not to_time_again(None, 4, which)
        assert not to_time_again(_record(3, [True], "failed"), 4, which)
    assert noisy_earlier(busy, 4) and not noisy_earlier(quiet, 4)


def test_the_cli_s_retime_choices_are_the_sweep_s() -> None:
    import typing

    from quantlab.cli import build_parser

    run = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    retime = next(a for a in run._actions if a.dest == "retime")
    assert tuple(retime.choices) == typing.get_args(Retime) and retime.const == "noisy" and retime.default is None
    assert run.parse_args(["r.yaml", "--retime"]).retime == "noisy"
    assert run.parse_args(["r.yaml", "--retime", "all"]).retime == "all"
    assert run.parse_args(["r.yaml"]).retime is None


@pytest.fixture
def solve_recipe():
    return validate_recipe({"name": "solve", "model": {"bundled": "tiny-stdlib-llama"},
                            "weights": [{"format": "gptq", "bits": 4, "group_size": 128}, "fp32"],
                            "kv_cache": ["native", {"format": "int8", "group_size": 32, "residual_tokens": 0}],
                            "workload": WORKLOAD, "device": "cpu", "calibration": {"samples": 4, "seq_len": 128}})


def test_a_variant_waits_while_a_twin_solves_its_weights_then_goes_on(solve_recipe, tmp_path: Path) -> None:
    import torch

    gptq_native, gptq_int8, fp32_native, fp32_int8 = solve_recipe.variants()
    folder = RunFolder(tmp_path / "out")
    folder.path.mkdir()
    solver = Claims(folder.path).try_claim(gptq_native.key)  # another process solving GPTQ right now
    sweep = Sweep(solve_recipe, folder, 0, lambda _: None)
    started: list[str] = []
    sweep.start = lambda index, variant, claim, tag: (started.append(variant.label), sweep.claims.release(claim))
    held = sweep.one_pass()
    assert started == [fp32_native.label, fp32_int8.label]  # the twin of the solve waits
    assert set(held) == {gptq_native.key, gptq_int8.key} and held[gptq_int8.key].path == solver.path
    kept = shared_weights_path(solve_recipe, gptq_int8, torch.device("cpu"), folder.path)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"solved")  # the solver kept its weights: the twin loads them instead of solving
    started.clear()
    sweep.one_pass()
    assert gptq_int8.label in started and gptq_native.label not in started
    assert sweep.solving_elsewhere(gptq_int8) is None


def test_a_twin_whose_solver_gave_up_its_claim_solves_its_own(solve_recipe, tmp_path: Path) -> None:
    gptq_native, gptq_int8, *_ = solve_recipe.variants()
    folder = RunFolder(tmp_path / "out")
    folder.path.mkdir()
    claims = Claims(folder.path)
    claims.release(claims.try_claim(gptq_native.key))  # the solve ended without keeping weights (it failed)
    sweep = Sweep(solve_recipe, folder, 0, lambda _: None)
    assert sweep.solving_elsewhere(gptq_int8) is None
    assert json.loads(json.dumps(sweep.recipe.to_spec()))["name"] == "solve"


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_add_reports_a_second_recipe_beside_the_first_in_one_folder(tmp_path: Path) -> None:
    from quantlab.report import load_rows

    def recipe(name: str, weights: list) -> object:
        return validate_recipe({"name": name, "model": {"bundled": "tiny-stdlib-llama"}, "weights": weights,
                                "workload": WORKLOAD, "isolation": "none", "device": "cpu"})

    out = run_recipe(recipe("first", ["fp32"]), tmp_path / "out", log=lambda _: None)
    from quantlab.errors import QuantlabError

    with pytest.raises(QuantlabError, match="holds the records of recipe 'first', not 'second'"):
        run_recipe(recipe("second", ["bf16"]), out, log=lambda _: None)
    run_recipe(recipe("second", ["bf16"]), out, log=lambda _: None, add=True)
    rows, manifest = load_rows(out)
    assert [r["variant"] for r in rows] == ["fp32", "bf16"] and manifest["recipes"] == ["first", "second"]
    assert manifest["baseline"] == "bf16"  # the last recipe's baseline; both recipes' rows reported


def test_a_kv_format_that_would_keep_most_of_the_workload_unquantized_is_warned_about() -> None:
    from quantlab.run.runner import kv_residual_warnings

    recipe = validate_recipe({"name": "kv", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                              "workload": {"prompt_tokens": [16, 512], "new_tokens": 128},
                              "kv_cache": ["native", {"format": "int4", "group_size": 32, "residual_tokens": 128},
                                           {"format": "int4", "group_size": 32, "residual_tokens": 32}]})
    warnings = kv_residual_warnings(recipe)
    assert len(warnings) == 1 and warnings[0].startswith("warning: kv_cache[1] (int4-g32-r128) keeps 128 of the 144")


def test_a_re_timing_keeps_a_record_measured_on_another_machine_and_a_plain_run_measures_it_again(tmp_path) -> None:
    recipe = validate_recipe({"name": "keep", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                              "workload": WORKLOAD, "device": "cpu"})
    folder = RunFolder(tmp_path)
    other = {"status": "ok", "sweep": 0, "fingerprint_id": "0" * 16, "fingerprint": {"host": "quiet-box"}}
    assert Sweep(recipe, folder, 1, lambda _: None).stands(other) is None  # a plain run measures it here
    for retime in ("noisy", "all"):
        kept = Sweep(recipe, folder, 1, lambda _: None, retime=retime).stands(other)
        assert kept == "measured on quiet-box, kept (its timing is what a re-timing measures)"
    assert Sweep(recipe, folder, 1, lambda _: None, keep_measured=True).stands({**other, "status": "failed"}) is None
