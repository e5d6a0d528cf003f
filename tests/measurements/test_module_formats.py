"""Per-module formats in a run: every mixed or overridden variant lists its linears by format."""
from pathlib import Path

import pytest

from quantlab import run_recipe, validate_recipe
from quantlab.files import read_jsonl
from quantlab.measurements.module_formats import summarize


def test_the_summary_groups_linears_by_format_module_type_and_layer_ranges() -> None:
    formats = {f"model.layers.{i}.mlp.down_proj": "int8" if i in (0, 1, 2, 5) else "int4" for i in range(7)}
    formats["model.layers.3.self_attn.q_proj"] = "int8"
    formats["lm_head"] = "int8"
    assert summarize(formats) == "int8 ×6 (down_proj 0-2,5; q_proj 3; lm_head) · int4 ×3 (down_proj 3-4,6)"


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_run_records_the_assignment_and_the_report_lists_it(tmp_path: Path) -> None:
    recipe = validate_recipe({
        "name": "mf", "model": {"bundled": "tiny-stdlib-llama"}, "device": "cpu", "isolation": "none",
        "weights": ["fp32", {"format": "int4", "group_size": 64, "overrides": [{"modules": "*.down_proj", "format": "int8"}]},
                    {"format": "mixed", "candidates": ["int8", {"format": "int2", "group_size": 64}], "bits_per_weight": 5,
                     "scan_tokens": 128}],
        "workload": {"batch_size": 1, "prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
        "calibration": {"samples": 2, "seq_len": 128}})
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    assert all(r["status"] == "ok" for r in rows.values())
    assert "module_formats" not in rows["fp32"]
    override = rows["int4-g64-asym+int8-pc-asym@down_proj"]
    assert "int4-g64-asym ×36 (q_proj 0-5; k_proj 0-5;" in override["module_format_summary"]
    assert "int8-pc-asym ×6 (down_proj 0-5)" in override["module_format_summary"]
    mixed = next(r for v, r in rows.items() if v.startswith("mixed:5bpw"))
    assert set(mixed["module_formats"].values()) == {"int8-pc-asym", "int2-g64-asym"} and len(mixed["module_formats"]) == 42
    # measured bytes per format add up to the quantized linears' bytes
    assert sum(mixed["module_format_bytes"].values()) == mixed["weight_bytes_quantized_linear"]
    assert mixed["weight_bytes_quantized_linear"] <= 5 * sum(
        o * i for o, i in [(256, 256), (128, 256), (128, 256), (256, 256), (640, 256), (640, 256), (256, 640)]) * 6 / 8
    md = (out / "report.md").read_text()
    assert "## Per-module formats" in md and "int8-pc-asym ×6 (down_proj 0-5)" in md
