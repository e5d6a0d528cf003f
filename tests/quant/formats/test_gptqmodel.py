"""quantlab's GPTQ against GPTQModel's on the bundled model (runs where the gptq extra is installed)."""
from pathlib import Path

import pytest

pytest.importorskip("gptqmodel")

from quantlab import run_recipe, validate_recipe  # noqa: E402
from quantlab.files import read_jsonl  # noqa: E402


@pytest.mark.slow
def test_both_gptq_backends_agree_on_perplexity(tmp_path: Path) -> None:
    settings = {"bits": 4, "group_size": 128}
    recipe = validate_recipe({
        "name": "gptq-backends", "model": {"bundled": "tiny-stdlib-llama"},
        "weights": ["fp32", {"format": "gptq", **settings}, {"format": "gptqmodel", **settings},
                    {"format": "int4", "group_size": 128}],
        "workload": {"prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
        "evaluations": {"perplexity": {"window_tokens": 256, "max_tokens": 16384}},
        "calibration": {"samples": 32, "seq_len": 256}, "isolation": "none", "device": "cpu",
    })
    rows = {r["variant"]: r for r in read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")}
    assert all(r["status"] == "ok" for r in rows.values()), {k: r.get("error") for k, r in rows.items()}
    ours, theirs = rows["int4-g128-asym-gptq"]["perplexity"], rows["int4-g128-asym-gptqmodel"]["perplexity"]
    assert abs(ours - theirs) / theirs < 0.02
    assert rows["int4-g128-asym-gptqmodel"]["weight_bytes"] == rows["int4-g128-asym-gptq"]["weight_bytes"]
