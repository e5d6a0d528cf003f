"""``quantlab plan`` on the bundled model: measured options, the choice within the budget and no worse than any
uniform configuration that fits, the memory arithmetic against the formats' own formulas, deployable entries."""
from pathlib import Path

import pytest
import torch

from quantlab.cli import main
from quantlab.data import load_text
from quantlab.eval.tokens import tokenize
from quantlab.extend import KV_FORMATS
from quantlab.models import bundled_models
from quantlab.plan.planner import Workload, deployable, kv_groups, plan_model, write_plan
from quantlab.quant.format import Calibration, build_format

MIB = 2 ** 20


@pytest.fixture(scope="module")
def planned():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = bundled_models()["tiny-stdlib-llama"]
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ids = tokenize(AutoTokenizer.from_pretrained(src), load_text("bundled-heldout"))
    baseline = build_format("fp32")
    weights = [build_format({"format": "int8", "group_size": 32}), build_format({"format": "int4", "group_size": 32})]
    native = KV_FORMATS["native"].build()
    kvs = [KV_FORMATS["int8"].build(group_size=32, residual_tokens=0),
           KV_FORMATS["int4"].build(group_size=32, residual_tokens=0)]
    workload = Workload(10 * MIB, 1024, 4)
    samples = [ids[i * 64:(i + 1) * 64].view(1, 64) for i in range(2)]
    result = plan_model(model, baseline, weights, native, kvs, Calibration(samples), samples, ids[:64].view(1, 64),
                        workload, kv_group_layers=3, chunk_tokens=32)
    return model, result, (baseline, weights, native, kvs)


def test_the_plan_fits_and_beats_every_uniform_configuration_that_fits(planned) -> None:
    model, result, _ = planned
    plan, budget = result.plan, result.workload.memory_bytes
    assert plan.exact and plan.total_bytes <= budget
    assert len(result.groups) == 6 + 2  # a weight group per layer, KV groups of 3 layers
    fitting = [u for u in result.uniform if u.total_bytes <= budget]
    assert fitting and plan.predicted_kl_nats <= min(u.predicted_kl_nats for u in fitting) + 1e-12
    assert all(g.options[0].kl_nats == 0.0 for g in result.groups)  # the baseline's own option costs nothing
    for g in result.groups:  # fewer bits, more divergence, fewer bytes
        by = {o.label.split("-")[0]: o for o in g.options}
        assert by["int4"].bytes < by["int8"].bytes < g.options[0].bytes
        assert by["int4"].kl_nats > by["int8"].kl_nats > 0
    assert [p.predicted_kl_nats for p in result.frontier] == sorted((p.predicted_kl_nats for p in result.frontier),
                                                                      reverse=True)


def test_the_memory_is_the_formats_own_arithmetic(planned) -> None:
    model, result, (_, _, native, kvs) = planned
    w = result.workload
    uniform = {u.uniform: u for u in result.uniform}
    base_linears = sum(m.weight.numel() * 4 for n, m in model.named_modules()
                       if isinstance(m, torch.nn.Linear) and n != "lm_head")
    for kv in [native, *kvs]:
        u = uniform[("fp32", kv.label)]
        assert u.bytes_by_kind["kv"] == kv.cache_bytes_analytic(model.config, w.batch_size, w.context_tokens,
                                                                torch.float32)
        assert u.bytes_by_kind["weights"] == base_linears
    params = {p.untyped_storage().data_ptr(): p.numel() * 4 for p in model.parameters()}
    assert result.fixed_bytes + base_linears == sum(params.values())  # every parameter counted once


def test_the_plan_deploys_as_recipe_entries(planned, tmp_path: Path) -> None:
    model, result, formats = planned
    entries = deployable(result, *formats)
    weights = build_format(entries["weights"])
    kv = KV_FORMATS[entries["kv_cache"]["format"]].build(**{k: v for k, v in entries["kv_cache"].items()
                                                              if k != "format"})
    for name, option in result.plan.choice.items():
        if name in result.weight_modules:
            for module in result.weight_modules[name]:
                chosen = weights.format_for(module)
                assert (chosen.scheme_label if chosen is not weights else "fp32") == option.label
        else:
            for layer in result.kv_layers[name]:
                found = kv.format_of(layer) if hasattr(kv, "format_of") else kv
                assert found.label == option.label
    path = write_plan(result, entries, tmp_path)
    text = path.read_text()
    assert f"{result.plan.predicted_kl_nats:.5f}" in text and "activations, workspace and runtime overhead not" in text
    assert (tmp_path / "plan.json").exists() and (tmp_path / "plan-entries.yaml").exists()


def test_kv_groups_keep_attention_kinds_apart() -> None:
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(num_hidden_layers=12, sliding_window=64, vocab_size=256, hidden_size=64,
                              intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    groups = kv_groups(config, 4)
    assert [i for g in groups for i in g] == list(range(12))
    kinds = config.layer_types
    assert all(len({kinds[i] for i in g}) == 1 and len(g) <= 4 for g in groups)


@pytest.mark.parametrize("args,message", [
    (["--memory", "lots", "--context", "8"], "--memory: expected a size such as 80GiB"),
    (["--memory", "1GiB", "--context", "0"], "--context must be at least 1"),
])
def test_bad_flags_are_one_line_before_any_work(args: list[str], message: str, capsys) -> None:
    assert main(["plan", "recipes/quickstart.yaml", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_run_plan_writes_a_recipe_that_measures_the_plan_beside_the_recipe_s_formats(tmp_path: Path) -> None:
    import yaml

    from quantlab.plan.command import run_plan
    from quantlab.run.recipe import load_recipe

    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(yaml.safe_dump({
        "name": "tiny", "model": {"bundled": "tiny-stdlib-llama", "dtype": "float32"},
        "weights": ["fp32", {"format": "int4", "group_size": 32}],
        "kv_cache": ["native", {"format": "int4", "group_size": 32, "residual_tokens": 0}],
        "evaluations": {"perplexity": {"protocol": "kv-chunked", "window_tokens": 64, "chunk_tokens": 32,
                                       "text": "bundled-heldout"}},
        "calibration": {"text": "bundled-heldout", "samples": 2, "seq_len": 64, "seed": 0}, "baseline": "fp32"}))
    path = run_plan(load_recipe(recipe_file), Workload(9 * MIB, 512, 4), tmp_path / "plan", scan_tokens=128,
                    kv_window_tokens=64, kv_windows=1, kv_group_layers=6)
    assert path.name == "plan.md"
    planned = load_recipe(tmp_path / "plan" / "plan-recipe.yaml")
    weights, kvs = [w.label for w in planned.weights], [k.label for k in planned.kv_cache]
    assert weights[:2] == ["fp32", "int4-g32-asym"] and len(weights) == 3  # the recipe's own, then the plan's
    assert kvs[:2] == ["native", "int4-g32-r0"]  # the plan's cache added unless it is one of them
    chosen_kv = {o.label for name, o in json_choice(tmp_path / "plan" / "plan.json").items() if name.startswith("kv")}
    assert len(kvs) == (2 if len(chosen_kv) == 1 else 3)
    assert planned.baseline_label == "fp32/kv-native" and len(planned.variants()) == len(weights) * len(kvs)


def json_choice(path: Path) -> dict:
    import json
    from types import SimpleNamespace

    return {k: SimpleNamespace(label=v["format"]) for k, v in json.loads(path.read_text())["choice"].items()}
