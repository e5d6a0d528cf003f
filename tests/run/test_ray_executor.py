"""Sweeps on a local Ray instance (CPU, two workers): the same variants and figures as a local run, and a worker
lost mid-variant recorded as failed and measured again by the next run."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from quantlab import run_recipe, validate_recipe  # noqa: E402
from quantlab.files import read_jsonl  # noqa: E402

WORKLOAD = {"batch_size": 1, "prompt_tokens": 16, "new_tokens": 4, "warmup_runs": 1, "prefill_repeats": 1, "engine": "eager"}
FIGURES = ("variant", "variant_key", "status", "weight_bytes", "weight_bytes_analytic", "kv_cache_bytes", "perplexity",
           "kernel_path")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _recipe(model: dict, weights: list) -> dict:
    return {"name": "ray", "model": model, "weights": weights, "workload": WORKLOAD, "device": "cpu",
            "evaluations": {"perplexity": {"window_tokens": 64, "max_tokens": 512}}}


@pytest.mark.slow  # a local and a Ray run end to end; CI's slow tier runs it
def test_a_ray_sweep_gives_the_variants_and_figures_of_a_local_run(local_ray, tmp_path: Path) -> None:
    spec = _recipe({"bundled": "tiny-stdlib-llama"}, ["fp32", "int8", {"format": "int4", "group_size": 128}])
    local = read_jsonl(run_recipe(validate_recipe({**spec, "isolation": "none"}), tmp_path / "local", log=lambda _: None)
                       / "results.jsonl")
    logs: list[str] = []
    out = run_recipe(validate_recipe({**spec, "executor": {"kind": "ray", "cpus_per_variant": 1}}), tmp_path / "ray",
                     log=logs.append)
    remote = read_jsonl(out / "results.jsonl")
    assert [tuple(r.get(k) for k in FIGURES) for r in remote] == [tuple(r.get(k) for k in FIGURES) for r in local]
    assert sum(m.endswith(": running") for m in logs) == 3 and "ray: 3 done, 0 running, 0 failed" in logs
    assert all(r["environment"]["cpu_threads"] == 1 for r in remote)  # each task on the one CPU it reserved
    assert list((out / "claims").glob("*.json")) == []


KILLER = '''import os

from transformers import LlamaForCausalLM

FLAG = {flag!r}


class KillOnceLlama(LlamaForCausalLM):
    """Kills the process that first builds it (a worker lost mid-variant); builds normally afterwards."""

    def __init__(self, config):
        try:
            fd = os.open(FLAG, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            super().__init__(config)
            return
        os.close(fd)
        os.kill(os.getpid(), 9)
'''


@pytest.mark.slow
def test_a_lost_worker_is_a_failed_record_that_the_next_run_measures_again(
        local_ray, small_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(small_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "killer.KillOnceLlama"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "killer.py").write_text(KILLER.format(flag=str(tmp_path / "killed-once")))
    recipe = validate_recipe({**_recipe({"path": str(model), "trust_remote_code": True}, ["fp32", "int8"]),
                              "executor": {"kind": "ray"}})
    out = tmp_path / "out"
    run_recipe(recipe, out, log=lambda _: None)
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    failed = [r for r in rows.values() if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"].startswith("ray worker lost")
    assert (tmp_path / "killed-once").exists()
    logs: list[str] = []
    run_recipe(recipe, out, log=logs.append)
    assert [m for m in logs if m.endswith(": running")] == [f"[{list(rows).index(failed[0]['variant']) + 1}/2] "
                                                            f"{failed[0]['variant']}: running"]
    assert all(r["status"] == "ok" for r in read_jsonl(out / "results.jsonl"))


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_without_ray_the_executor_is_a_one_line_error_naming_the_extra(tmp_path: Path) -> None:
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "r", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"]}))
    probe = ("import sys; sys.modules['ray'] = None\nfrom quantlab.cli import main\n"
             f"sys.exit(main(['run', {str(recipe)!r}, '--out', {str(tmp_path / 'out')!r}, '--executor', 'ray']))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "quantlab: error: --executor ray needs Ray: pip install 'quantlab[ray]'"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_an_interrupted_driver_resumes_measuring_nothing_twice(local_ray, tmp_path: Path) -> None:
    recipe = validate_recipe({**_recipe({"bundled": "tiny-stdlib-llama"}, ["fp32", "int8", {"format": "int4", "group_size": 128}]),
                              "executor": {"kind": "ray"}})
    out = tmp_path / "out"

    def stop_after_the_first_record(message: str) -> None:
        if message.startswith("ray: 1 done"):
            raise KeyboardInterrupt  # as Ctrl-C on the driver would

    with pytest.raises(KeyboardInterrupt):
        run_recipe(recipe, out, log=stop_after_the_first_record)
    first = {p.stem for p in (out / "records").glob("*.json")}
    assert len(first) == 1 and list((out / "claims").glob("*.json")) == []  # the running tasks' claims given back
    logs: list[str] = []
    run_recipe(recipe, out, log=logs.append)
    assert sum(m.endswith(": running") for m in logs) == 2 and sum("already measured" in m for m in logs) == 1
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
