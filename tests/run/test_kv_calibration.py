"""A run gives a KV format with static scales its figures from the variant's own model on the recipe's calibration
text, before anything is measured, and records what was calibrated beside the cache's bytes."""
from pathlib import Path

import pytest

from quantlab.records.folder import RunFolder
from quantlab.run.recipe import validate_recipe
from quantlab.run.runner import run_recipe


@pytest.mark.slow  # a whole run of two variants (about 20 s): CI's slow tier; tests/kv/test_calibrated.py covers the form
def test_a_run_calibrates_per_head_fp8_scales_and_records_them(tmp_path: Path) -> None:
    recipe = validate_recipe({"name": "kvcal", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                              "kv_cache": ["fp8", {"format": "fp8", "scales": "head"}], "device": "cpu",
                              "workload": {"prompt_tokens": 16, "new_tokens": 4, "warmup_runs": 0, "engine": "eager"},
                              "evaluations": {"perplexity": {"window_tokens": 64, "max_tokens": 128}},
                              "calibration": {"samples": 2, "seq_len": 64}, "isolation": "none"})
    folder = RunFolder(run_recipe(recipe, tmp_path / "out", log=lambda _: None))
    dynamic, static = (folder.read_record(v.key) for v in recipe.variants())
    assert static["status"] == "ok", static.get("error")
    kv = [r["points"][0]["measurements"]["kv_cache"] for r in (dynamic, static)]
    assert kv[0]["kv_cache_calibration"] is None
    assert "per KV head" in kv[1]["kv_cache_calibration"] and "128 tokens of stdlib-train" in kv[1]["kv_cache_calibration"]
    # one byte a value: the per-position float16 scales of the dynamic fp8 cache are gone
    assert kv[1]["kv_cache_bytes"] == kv[1]["kv_cache_bytes_analytic"] < kv[0]["kv_cache_bytes"]
    ppl = [r["measurements"]["perplexity"]["perplexity"] for r in (dynamic, static)]
    assert abs(ppl[1] / ppl[0] - 1) < 0.05  # both near the model's own: the scales are sane
