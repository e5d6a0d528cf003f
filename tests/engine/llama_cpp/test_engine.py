"""``engine: llama.cpp``: a recipe's variants measured by llama.cpp from their GGUF exports, beside quantlab's rows.

Without llama-cpp-python (as in CI) the recipe-level behaviour is still checked: one variant per engine, labels and
resume keys, and the one-line refusals of what llama.cpp cannot measure."""
import json
import math
from pathlib import Path

import pytest
import torch

from quantlab import run_recipe, validate_recipe
from quantlab.errors import RecipeError

WORKLOAD = {"batch_size": 1, "prompt_tokens": 32, "new_tokens": 8, "warmup_runs": 1, "prefill_repeats": 2}
Q8_0 = {"format": "gguf", "type": "Q8_0"}


def recipe(**changes) -> dict:
    spec = {"name": "engines", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32", Q8_0],
            "workload": {**WORKLOAD, "engine": ["auto", "llama.cpp"]}, "isolation": "none", "device": "cpu",
            "evaluations": {"perplexity": {"protocol": "windows", "window_tokens": 256, "max_tokens": 2048,
                                           "text": "bundled-heldout"},
                            "divergence": {"batch_size": 4}}}
    spec.update(changes)
    return spec


def test_every_variant_is_measured_on_each_engine_and_a_single_engine_keeps_its_keys() -> None:
    both = validate_recipe(recipe())
    labels = [v.label for v in both.variants()]
    assert labels == ["fp32@auto", "fp32@llama.cpp", "gguf-q8_0@auto", "gguf-q8_0@llama.cpp"]
    assert both.baseline_label == "fp32@auto"
    one = validate_recipe(recipe(workload=WORKLOAD))  # engine: auto, the default
    assert [v.label for v in one.variants()] == ["fp32", "gguf-q8_0"]
    assert [v.key for v in one.variants()] == [v.key for v in both.variants() if v.engine == "auto"]
    eager = validate_recipe(recipe(workload={**WORKLOAD, "engine": "eager"}))
    assert eager.variants()[0].key != one.variants()[0].key
    assert len({v.key for v in both.variants()}) == 4


@pytest.mark.parametrize("changes,field", [
    ({"workload": {**WORKLOAD, "batch_size": [1, 2], "engine": ["auto", "llama.cpp"]}}, "batch_size must be 1"),
    ({"kv_cache": ["native", "int8"]}, "kv_cache\\[1\\]: engine llama.cpp has no cache type for int8"),
    ({"evaluations": {"perplexity": {"protocol": "kv-chunked", "window_tokens": 256}}},
     "evaluations.perplexity: protocol kv-chunked does not score whole windows"),
    ({"evaluations": {"perplexity": {"window_tokens": 256}}, "baseline": "fp32@llama.cpp"}, "baseline"),
])
def test_what_llama_cpp_cannot_measure_is_refused_in_one_line(changes: dict, field: str) -> None:
    with pytest.raises(RecipeError, match=field) as caught:
        validate_recipe(recipe(**changes))
    assert "\n" not in str(caught.value)


def test_the_childs_cpu_share_is_left_unknown_over_too_few_clock_ticks() -> None:
    import os

    from quantlab.engine.llama_cpp.process import MIN_TICKS, LlamaCppProcess

    short = (MIN_TICKS - 1) / os.sysconf("SC_CLK_TCK")  # /proc counts CPU time in ticks: a 0 would read as idle
    assert LlamaCppProcess.cpu_share(0.0, short, 2) is None
    assert LlamaCppProcess.cpu_share(3.0, 2.0 * short * 2, 2) == pytest.approx(3.0 / (4 * short * 2), abs=1e-3)


def test_a_llama_cpp_child_that_crashes_is_one_error_naming_the_signal() -> None:
    """llama.cpp prints nothing when it crashes (an AMX segfault): the error says how its process ended."""
    import subprocess
    import sys

    from quantlab.engine.llama_cpp.process import LlamaCppProcess
    from quantlab.errors import UnsupportedError

    crashed = LlamaCppProcess.__new__(LlamaCppProcess)
    crashed.path = Path("model.gguf")
    crashed.proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                                    stdout=subprocess.PIPE, text=True)
    with pytest.raises(UnsupportedError, match="model.gguf: its process was killed by SIGSEGV .*AMX"):
        crashed._read()
    crashed.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdout=subprocess.PIPE, text=True)
    with pytest.raises(UnsupportedError, match="exited with status 3"):
        crashed._read()


@pytest.mark.llama_cpp
def test_llama_cpp_rows_are_measured_from_the_exported_file_beside_quantlabs(tmp_path: Path) -> None:
    from quantlab.engine.llama_cpp.process import LlamaCppProcess, gguf_tensor_bytes
    from quantlab.eval.tokens import scored_text
    from quantlab.kv import KV_FORMATS
    from quantlab.models import ModelSpec, load_config, load_tokenizer

    spec = validate_recipe(recipe())
    out = run_recipe(spec, tmp_path / "run", log=lambda _: None)
    records = {r["variant"]: r for r in (json.loads(p.read_text()) for p in (out / "records").glob("*.json"))}
    assert {label: r["status"] for label, r in records.items()} == dict.fromkeys(
        ["fp32@auto", "fp32@llama.cpp", "gguf-q8_0@auto", "gguf-q8_0@llama.cpp"], "ok")
    config = load_config(ModelSpec(bundled="tiny-stdlib-llama"))
    ids, _ = scored_text("bundled-heldout", load_tokenizer(ModelSpec(bundled="tiny-stdlib-llama")), 2048)
    windows = ids[: ids.numel() // 256 * 256].reshape(-1, 256).tolist()
    for weight in ("fp32", "gguf-q8_0"):
        ours, served = records[f"{weight}@auto"], records[f"{weight}@llama.cpp"]
        gguf = out / "exports" / f"{weight}_llama.cpp" / "gguf" / "model.gguf"
        point = served["points"][0]["measurements"]
        latency, kv, weights = point["latency"], point["kv_cache"], served["measurements"]["weights"]
        assert latency["engine"] == "llama.cpp" and latency["engine_options"]["cache_type"] == "f16"
        assert latency["decode_steps"] == len(latency["decode_ms_samples"]) == 8 and latency["threads"] >= 1
        share = latency["process_cpu_share"]  # the child's CPU, not the idle parent's; None: too short a section
        assert share is None or 0 < share <= 1.5
        assert weights["weight_bytes"] == weights["decode_weight_bytes_read"] == gguf_tensor_bytes(gguf)
        assert weights["kernel_path"] == "llama.cpp"
        native = KV_FORMATS["native"].build().cache_bytes_analytic(config, 1, 40, torch.float32)
        assert kv["kv_cache_bytes"] == native // 2 and kv["kv_cache_tokens"] == 40  # f16: 2 of float32's 4 bytes
        assert point["peak_memory"]["peak_memory_bytes"] > gguf_tensor_bytes(gguf)
        # perplexity: llama.cpp's own NLL of the same windows (its scoring command), through quantlab's protocol
        with LlamaCppProcess(gguf, threads=torch.get_num_threads(), cache_type="f16") as llama:
            got = llama.ask(cmd="nll", windows=windows, window=256)
        ppl = served["measurements"]["perplexity"]["perplexity"]
        assert ppl == pytest.approx(math.exp(got["nll_sum"] / got["tokens"]), rel=1e-4)
        assert ppl == pytest.approx(ours["measurements"]["perplexity"]["perplexity"], rel=0.01)
        divergence = served["measurements"]["divergence"]
        assert divergence["divergence_protocol"]["baseline"] == "fp32@auto"
        assert divergence["kl_divergence_mean"] < 0.01 and divergence["top1_agreement_percent"] > 95
    assert records["fp32@auto"]["measurements"]["divergence"]["kl_divergence_mean"] == pytest.approx(0, abs=1e-6)
    report = (out / "report.md").read_text()
    assert "gguf-q8_0@llama.cpp" in report and "llama.cpp" in report


@pytest.mark.llama_cpp
def test_llama_cpp_generates_greedily_through_its_own_cache_for_generation_agreement(tmp_path: Path) -> None:
    spec = recipe(weights=["fp32"], evaluations={
        "perplexity": {"protocol": "windows", "window_tokens": 256, "max_tokens": 2048, "text": "bundled-heldout"},
        "generation": {"prompts": 2, "new_tokens": 12}})
    out = run_recipe(validate_recipe(spec), tmp_path / "run", log=lambda _: None)
    records = {r["variant"]: r for r in (json.loads(p.read_text()) for p in (out / "records").glob("*.json"))}
    ours, served = (records[k]["measurements"]["generation"] for k in ("fp32@auto", "fp32@llama.cpp"))
    assert ours["generation_identical_percent"] == 100 and ours["generation_kl_mean"] == 0
    assert served["generation_protocol"]["engine"] == "llama.cpp"
    # the same fp32 weights in llama.cpp (f16 cache): the continuations agree for most of their length
    assert served["generation_tokens_to_first_difference_mean"] >= 6 and 0 < served["generation_kl_mean"] < 0.01
    gguf = out / "exports" / "fp32_llama.cpp" / "gguf" / "model.gguf"
    from quantlab.engine.llama_cpp.engine import LlamaCppVariant

    variant = LlamaCppVariant(gguf, "f16", 2, 64)
    try:
        prompts = torch.randint(0, 4096, (2, 20), generator=torch.Generator().manual_seed(0))
        tokens, logprobs = variant.generate(prompts, 50)  # longer than the 64 positions of the timing context
        assert tokens.shape == (2, 50) and logprobs.shape == (2, 50, 4096)
        assert torch.equal(tokens, logprobs.argmax(-1))  # greedy on its own distributions
        assert torch.allclose(logprobs.exp().sum(-1), torch.ones(2, 50), atol=1e-4)
        follow = torch.randint(0, 4096, (2, 50), generator=torch.Generator().manual_seed(1))
        forced, _ = variant.generate(prompts, 50, follow=follow)
        assert torch.equal(forced, follow)
    finally:
        variant.close()
