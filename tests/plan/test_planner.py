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
    assert len(result.groups) == 6 + 1 + 2  # a weight group per layer, the output head, KV groups of 3 layers
    fitting = [u for u in result.uniform if u.total_bytes <= budget]
    assert fitting and plan.predicted_kl_nats <= min(u.predicted_kl_nats for u in fitting) + 1e-12
    assert all(g.options[0].kl_nats == 0.0 for g in result.groups)  # the baseline's own option costs nothing
    head = next(g for g in result.groups if g.name == "weights lm_head")
    table = model.get_input_embeddings().weight.numel() * 4
    for g in result.groups:  # fewer bits, more divergence, fewer bytes
        by = {o.label.split("-")[0]: o for o in g.options}
        assert by["int4"].kl_nats > by["int8"].kl_nats > 0
        if g is head:  # tied: a quantized head keeps the lookup table beside it, so it only costs bytes
            assert g.options[0].bytes == table and by["int8"].bytes > table and not g.in_uniform
        else:
            assert by["int4"].bytes < by["int8"].bytes < g.options[0].bytes
    assert all(u.choice["weights lm_head"].label == "fp32" for u in result.uniform)  # as the plain formats leave it
    assert [p.predicted_kl_nats for p in result.frontier] == sorted((p.predicted_kl_nats for p in result.frontier),
                                                                      reverse=True)


def test_the_memory_is_the_formats_own_arithmetic(planned) -> None:
    model, result, (_, _, native, kvs) = planned
    w = result.workload
    uniform = {u.uniform: u for u in result.uniform}
    base_linears = sum(m.weight.numel() * 4 for n, m in model.named_modules()
                       if isinstance(m, torch.nn.Linear) and n != "lm_head")
    table = model.get_input_embeddings().weight.numel() * 4
    for kv in [native, *kvs]:
        u = uniform[("fp32", kv.label)]
        assert u.bytes_by_kind["kv"] == kv.cache_bytes_analytic(model.config, w.batch_size, w.context_tokens,
                                                                torch.float32)
        assert u.bytes_by_kind["weights"] == base_linears + table  # the tied table counted as the head's
    params = {p.untyped_storage().data_ptr(): p.numel() * 4 for p in model.parameters()}
    assert result.fixed_bytes + base_linears + table == sum(params.values())  # every parameter counted once


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
    assert f"{result.plan.predicted_kl_nats:.5f}" in text and "activations and workspace not included" in text
    assert (tmp_path / "plan.json").exists() and (tmp_path / "plan-entries.yaml").exists()
    svg = (tmp_path / "plan-frontier.svg").read_text()
    assert svg.startswith("<svg") and "plan-frontier.svg" in text
    uniform = [u for u in result.uniform if u.uniform]
    assert sum(f"point-label-{i}" in svg for i in range(len(uniform))) >= 1  # the uniform points are labelled
    rows = [line for line in text.split("## Layers")[1].split("##")[0].splitlines() if line.startswith("| ") and
            line[2].isdigit()]
    assert len(rows) == model.config.num_hidden_layers  # one row per decoder layer: its weights, its cache
    for row in rows:
        layer, weight_label, kv_label = (c.strip() for c in row.strip("|").split("|"))
        group = next(g for g, mods in result.weight_modules.items() if any(f".layers.{layer}." in m for m in mods))
        kv_group = next(g for g, lays in result.kv_layers.items() if int(layer) in lays)
        assert weight_label == result.plan.choice[group].label and kv_label == result.plan.choice[kv_group].label


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
    from quantlab.run.recipe import PlanSpec, load_recipe

    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(yaml.safe_dump({
        "name": "tiny", "model": {"bundled": "tiny-stdlib-llama", "dtype": "float32"},
        "weights": ["fp32", {"format": "int4", "group_size": 32}],
        "kv_cache": ["native", {"format": "int4", "group_size": 32, "residual_tokens": 0}],
        "evaluations": {"perplexity": {"protocol": "kv-chunked", "window_tokens": 64, "chunk_tokens": 32,
                                       "text": "bundled-heldout"}},
        "calibration": {"text": "bundled-heldout", "samples": 2, "seq_len": 64, "seed": 0}, "baseline": "fp32"}))
    spec = PlanSpec(memory_bytes=10 * MIB + (1 << 19), context_tokens=512, batch_size=4, prefill_chunk_tokens=16,
                    runtime_bytes=MIB, scan_tokens=128, kv_window_tokens=64, kv_windows=1, kv_group_layers=6)
    path = run_plan(load_recipe(recipe_file), spec, tmp_path / "plan")
    assert path.name == "plan.md"
    import json

    found = json.loads((tmp_path / "plan" / "plan.json").read_text())
    reserved = found["reserved"]
    assert reserved["runtime"]["bytes"] == MIB and reserved["activations"]["method"].startswith("analytic")
    by_kind = found["bytes_by_kind"]  # the reserved terms are held out of the budget, beside the parameters
    assert found["total_bytes"] == by_kind["fixed"] + by_kind["weights"] + by_kind["kv"] <= spec.memory_bytes
    assert by_kind["fixed"] >= MIB + reserved["activations"]["bytes"]
    assert "| runtime | 1.0 | given: the recipe's plan.runtime_bytes |" in path.read_text()
    measured = {m["configuration"]: m for m in found["measured"]}  # the plan and each fitting uniform, applied whole
    fitting = [u for u in found["uniform"] if u["total_bytes"] <= spec.memory_bytes]
    assert set(measured) == {"plan"} | {f"{u['weights']} + {u['kv_cache']}" for u in fitting}, measured.keys()
    assert len(fitting) >= 1
    for m in measured.values():
        assert m["total_bytes"] <= spec.memory_bytes and m["kl_nats"] > 0
        assert m["predicted_kl_nats"] / 3 < m["kl_nats"] < 3 * m["predicted_kl_nats"]  # near-additive here
    assert "## Predicted and measured" in path.read_text()
    planned = load_recipe(tmp_path / "plan" / "plan-recipe.yaml")
    weights, kvs = [w.label for w in planned.weights], [k.label for k in planned.kv_cache]
    assert weights[:2] == ["fp32", "int4-g32-asym"] and len(weights) == 3  # the recipe's own, then the plan's
    assert kvs[:2] == ["native", "int4-g32-r0"]  # the plan's cache added unless it is one of them
    chosen_kv = {o.label for name, o in json_choice(tmp_path / "plan" / "plan.json").items() if name.startswith("kv")}
    assert len(kvs) == (2 if len(chosen_kv) == 1 else 3)
    assert planned.baseline_label == "fp32/kv-native" and len(planned.variants()) == len(weights) * len(kvs)

    exports = planned.export  # the run that measures the plan exports it where its weights have a form
    chosen = exports[0].variants[0]
    assert chosen in [v.label for v in planned.variants()] and chosen != "fp32/kv-native"
    variant = planned.variant_named(chosen)
    assert exports[0].to == [t for t in ("gguf", "compressed-tensors") if variant.weight.export_refusal(t) is None]
    assert "compressed-tensors" in exports[0].to
    from quantlab.files import export_folder

    assert f"vllm serve {export_folder(Path('runs/plan'), chosen, 'compressed-tensors')} " in path.read_text()


def json_choice(path: Path) -> dict:
    import json
    from types import SimpleNamespace

    return {k: SimpleNamespace(label=v["format"]) for k, v in json.loads(path.read_text())["choice"].items()}


def test_the_activations_term_is_the_largest_forward_s_layer_and_the_logits() -> None:
    from transformers import Gemma3TextConfig, LlamaConfig

    from quantlab.plan.overhead import activation_bytes

    llama = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                        vocab_size=49152, num_hidden_layers=30)
    t, d_head = 512, 64  # SmolLM2-135M at 8 x 8,192: the scores (9 heads x 512 x 8,192 float32) dominate
    scores = 9 * t * 8192 * 4 + t * (9 + 6) * d_head * 2
    want = 2 * t * 576 * 2 + max(scores, 3 * t * 1536 * 2) + 8 * 49152 * 4
    assert activation_bytes(llama, 8, 8192, 512, torch.bfloat16).bytes == want
    # a short context: the MLP is the larger; a decode batch wider than the chunk sets the tokens
    short = activation_bytes(llama, 1024, 16, 512, torch.float32).bytes
    assert short == 2 * 1024 * 576 * 4 + 3 * 1024 * 1536 * 4 + 1024 * 49152 * 4
    # sliding layers attend their window; one global layer attends the whole context
    gemma = Gemma3TextConfig(num_hidden_layers=6, sliding_window=64, vocab_size=256, hidden_size=64,
                             intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    with_global = activation_bytes(gemma, 1, 4096, 32, torch.float32)
    gemma.layer_types = ["sliding_attention"] * 6
    only_sliding = activation_bytes(gemma, 1, 4096, 32, torch.float32)
    residual, logits, qkv = 2 * 32 * 64 * 4, 256 * 4, 32 * (2 + 2) * 32 * 4
    assert with_global.bytes == residual + qkv + 2 * 32 * 4096 * 4 + logits
    assert only_sliding.bytes == residual + 3 * 32 * 128 * 4 + logits  # 64 keys: the MLP is the larger
    assert "4,096 keys" in with_global.method and "64 keys" in only_sliding.method


def test_the_runtime_term_is_measured_in_a_fresh_process() -> None:
    from quantlab.plan.overhead import runtime_bytes

    term = runtime_bytes(torch.device("cpu"))
    assert term.method.startswith("measured") and 50 * MIB < term.bytes < 4096 * MIB  # torch alone is ~100s of MB


def test_plan_takes_the_recipe_s_plan_section_and_says_what_is_missing(tmp_path: Path, capsys) -> None:
    import yaml

    from quantlab.run.recipe import load_recipe

    raw = yaml.safe_load(Path("recipes/quickstart.yaml").read_text())
    with_plan = tmp_path / "with-plan.yaml"
    with_plan.write_text(yaml.safe_dump({**raw, "plan": {"memory_bytes": "1.5GiB", "context_tokens": 4096}}))
    spec = load_recipe(with_plan).plan
    assert spec.memory_bytes == 3 * 2 ** 29 and spec.batch_size == 1 and spec.runtime_bytes is None
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**raw, "plan": {"memory_bytes": "lots", "context_tokens": 4096}}))
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "plan.memory_bytes" in err and "80GiB" in err and "\n" not in err
    assert main(["plan", "recipes/quickstart.yaml", "--memory", "1GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plan.context_tokens: give --context or a plan: section" in err and "\n" not in err


def test_the_plan_s_cache_bytes_are_the_seed_lesson_s_worked_numbers() -> None:
    """Gemma 3 1B at 32,768 positions, bf16, batch 1: 872,415,232 bytes if every layer held the whole context;
    145,752,064 retained (its 22 sliding layers hold 512), the figure the plan budgets per layer."""
    from transformers import AutoConfig

    from quantlab.kv.format import layer_kv_bytes

    config = AutoConfig.from_pretrained(Path(__file__).parents[2] / "evals" / "configs" / "gemma-3-1b.json")
    native = KV_FORMATS["native"].build()
    per_layer = layer_kv_bytes(native, config, 1, 32768, torch.bfloat16)
    assert sum(per_layer) == 145_752_064 and len(per_layer) == 26
    assert sorted(set(per_layer)) == [2 * 256 * 512 * 2, 2 * 256 * 32768 * 2]  # K and V, one head of 256
    config.layer_types = ["full_attention"] * 26
    assert sum(layer_kv_bytes(native, config, 1, 32768, torch.bfloat16)) == 872_415_232


def test_keys_and_values_can_take_different_formats(planned) -> None:
    from quantlab.plan.command import split_pairs

    model, _, (baseline, weights, native, kvs) = planned
    pairs = split_pairs([native, *kvs])
    assert [p.label for p in pairs] == ["k=int8-g32-r0,v=int4-g32-r0", "k=int4-g32-r0,v=int8-g32-r0"]
    src_ids = tokenize_bundled()
    samples = [src_ids[:64].view(1, 64)]
    result = plan_model(model, baseline, [], native, [*kvs, *pairs], Calibration(samples), samples,
                        src_ids[:64].view(1, 64), Workload(40 * MIB, 1024, 4), kv_group_layers=6, chunk_tokens=32)
    (group,) = [g for g in result.groups if g.kind == "kv"]
    by = {o.label: o for o in group.options}
    for pair in pairs:  # half of each side's bytes, and a divergence between the two sides' own
        keys, values = by[pair.keys.label], by[pair.values.label]
        option = by[pair.label]
        assert 2 * option.bytes == keys.bytes + values.bytes
        assert min(keys.kl_nats, values.kl_nats) < option.kl_nats < max(keys.kl_nats, values.kl_nats) * 1.5


def tokenize_bundled() -> torch.Tensor:
    from transformers import AutoTokenizer

    return tokenize(AutoTokenizer.from_pretrained(bundled_models()["tiny-stdlib-llama"]), load_text("bundled-heldout"))


def test_an_untied_output_head_is_a_group_the_plan_can_quantize() -> None:
    from tests.conftest import make_llama

    model = make_llama(tie_word_embeddings=False)
    ids = torch.randint(0, 4096, (1, 128), generator=torch.Generator().manual_seed(0))
    baseline, int4 = build_format("fp32"), build_format({"format": "int4", "group_size": 32})
    native = KV_FORMATS["native"].build()
    samples = [ids[:, :64], ids[:, 64:]]
    head_bytes = 4096 * 128 * 4
    smallest = plan_model(model, baseline, [int4], native, [], Calibration(samples), samples, ids[:, :64],
                          Workload(1 << 40, 256, 1), chunk_tokens=32)
    head = next(g for g in smallest.groups if g.name == "weights lm_head")
    assert head.options[0].bytes == head_bytes and head.options[1].bytes == int4.linear_weight_bytes(
        4096, 128, torch.float32) < head_bytes and head.options[1].kl_nats > 0 and not head.in_uniform
    budget = smallest.fixed_bytes + sum(min(o.bytes for o in g.options) for g in smallest.groups)
    tight = plan_model(model, baseline, [int4], native, [], Calibration(samples), samples, ids[:, :64],
                       Workload(budget, 256, 1), chunk_tokens=32)
    assert tight.plan.choice["weights lm_head"].label == int4.scheme_label  # only the smallest options fit
    entries = deployable(tight, baseline, [int4], native, [])
    assert any("lm_head" in o["modules"] for o in entries["weights"]["overrides"])
    from quantlab import quantize_
    from quantlab.quant.linear import QuantizedLinear

    quantize_(model, build_format(entries["weights"]))
    assert isinstance(model.lm_head, QuantizedLinear)  # the deployed weights quantize the head as planned
