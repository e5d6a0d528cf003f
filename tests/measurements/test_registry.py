"""Every registered measurement renders from its own column specs in Markdown, HTML and CSV."""
import json
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pytest

from quantlab.measurements import MEASUREMENTS, Column, Measurement, Result, all_measurements, register
from quantlab.records.views import flat_row
from quantlab.report import write_report

PROTOCOL = {"name": "windows", "window_tokens": 64, "stride_tokens": 64, "scored_tokens": 100, "text": "t",
            "text_sha256": "0" * 64}

# One complete result per registered measurement. A new measurement adds its sample here (the test below fails
# until it does), and every column it declares must then show up in every view.
SAMPLES = {
    "weights": {"weight_bytes": 4 << 20, "weight_bytes_analytic": 4 << 20, "weight_bytes_estimate": 4 << 20,
                "estimate_params_source": "meta device", "weight_bytes_quantized_linear": 3 << 20,
                "weight_bytes_linear": 0, "weight_bytes_embedding": 1 << 20, "weight_bytes_other": 0,
                "decode_weight_bytes_read": 3 << 20, "quantized_modules": 7, "kernel_path": "int4pack_mm_cpu",
                "quantize_s": 0.5},
    "module_formats": {"module_formats": {"model.layers.0.mlp.down_proj": "int8-pc-asym",
                                          "model.layers.1.mlp.down_proj": "int4-g128-asym"},
                       "module_format_bytes": {"int8-pc-asym": 1 << 20, "int4-g128-asym": 1 << 19},
                       "module_format_summary": "int8-pc-asym ×1 (down_proj 0) · int4-g128-asym ×1 (down_proj 1)"},
    "kv_cache": {"kv_cache_bytes": 65536, "kv_cache_bytes_analytic": 65536, "kv_cache_bytes_estimate": 65536,
                 "kv_cache_tokens": 20},
    "peak_memory": {"peak_memory_bytes": 90 << 20, "peak_prefill_bytes": 90 << 20, "peak_decode_bytes": 80 << 20,
                    "peak_memory_method": "process peak RSS", "rss_before_load_bytes": 60 << 20,
                    "peak_reserved_bytes": 96 << 20},
    "latency": {"engine": "eager", "engine_options": {"compiled": False}, "prefill_ms": 3.0, "decode_ms_per_token": 2.0,
                "decode_ms_p10": 1.9, "decode_ms_p90": 2.4, "decode_steps": 4, "decode_ms_samples": [1.9, 2.0, 2.0, 2.4],
                "tokens_per_s": 500.0},
    "perplexity": {"perplexity": 60.25, "perplexity_protocol": PROTOCOL},
    "divergence": {"kl_divergence_mean": 0.012, "kl_divergence_median": 0.004, "kl_divergence_p90": 0.03,
                   "kl_divergence_p99": 0.2, "kl_divergence_max": 1.5, "top1_agreement_percent": 93.5,
                   "next_token_prob_rms_diff": 0.02, "delta_perplexity": 0.4, "delta_perplexity_ci95_low": 0.1,
                   "delta_perplexity_ci95_high": 0.7, "kl_divergence_mean_uncertainty": 0.001,
                   "kl_divergence_p999": 0.9, "kl_divergence_quantiles": {"max": 1.5, "99.9": 0.9, "median": 0.004,
                                                                           "min": 0.0},
                   "delta_p_mean_percent": -0.2, "delta_p_mean_uncertainty_percent": 0.05, "delta_p_rms_percent": 2.0,
                   "delta_p_rms_uncertainty_percent": 0.1, "delta_p_quantiles_percent": {"max": 9.0, "min": -12.0},
                   "same_top_p_percent": 93.0, "same_top_p_uncertainty_percent": 0.4, "ln_ppl_ratio_mean": 0.006,
                   "ln_ppl_ratio_uncertainty": 0.001, "ln_ppl_correlation_percent": 99.1,
                   "confidence_splits": {"<0.5": {"positions": 40, "share_percent": 31.7, "kl_mean": 0.03,
                                                  "kl_p99": 0.4, "delta_p_rms_percent": 3.0},
                                         "0.5-0.9": {"positions": 50, "share_percent": 39.7, "kl_mean": 0.01,
                                                     "kl_p99": 0.2, "delta_p_rms_percent": 2.0},
                                         ">=0.9": {"positions": 36, "share_percent": 28.6, "kl_mean": 0.002,
                                                   "kl_p99": 0.05, "delta_p_rms_percent": 0.5}},
                   "divergence_protocol": {"baseline": "fp32", "windows": 2, "window_tokens": 64, "scored_tokens": 126,
                                           "top_k": 128, "baseline_rest_mass_mean": 1e-3, "baseline_perplexity": 60.0,
                                           "reference": "0" * 16, "text": "t", "text_sha256": "0" * 64}},
    "generation": {"generation_tokens_to_first_difference_mean": 17.5, "generation_identical_percent": 25.0,
                   "generation_kl_mean": 0.02, "generation_kl_max": 1.2,
                   "generation_protocol": {"baseline": "fp32", "prompts": 4, "prompt_tokens": 64, "new_tokens": 32,
                                           "kv_format": "native", "baseline_kv_format": "native", "text": "t",
                                           "reference": "0" * 16}},
    "lm_eval_tasks": {"lm_eval_tasks": [{"task": "cont", "num_fewshot": 0, "limit": 10, "samples": 10,
                                         "lm_eval_version": "0.4.13", "metrics": {"acc": 0.5}}]},
}


def _record(key: str, scale: float) -> dict:
    measured = {n: m for n, m in all_measurements() if not m.derived}
    variant = {n: json.loads(json.dumps(SAMPLES[n])) for n, m in measured.items() if m.scope == "variant"}
    point = {n: json.loads(json.dumps(SAMPLES[n])) for n, m in measured.items() if m.scope == "point"}
    variant["weights"]["weight_bytes"] = int(variant["weights"]["weight_bytes"] * scale)
    variant["perplexity"]["perplexity"] *= 1 + (1 - scale)
    return {"record_version": 2, "variant": key, "variant_key": key, "status": "ok", "error": None, "recipe": "r",
            "model": "m", "weight_format": key, "kv_format": "native", "device": "cpu", "fingerprint_id": "f",
            "sweep": 0, "memory_bandwidth_bytes_per_s": 10**10, "memory_bandwidth_after_bytes_per_s": 5 * 10**9,
            "memory_bandwidth_method": "copy",
            "measurements": variant, "points": [{"batch_size": 1, "prompt_tokens": p, "measurements": point} for p in (16, 32)]}


def test_every_measurement_has_a_sample() -> None:
    measured = {n for n, m in all_measurements() if not m.derived}
    assert set(SAMPLES) == measured


def test_flat_field_names_are_unique_across_measurements() -> None:
    seen: dict[str, str] = {}
    for name, m in all_measurements():
        for field in m.result.model_fields:
            assert field not in seen, f"{field} is in both {seen.get(field)} and {name}"
            seen[field] = name


@pytest.fixture
def rendered(tmp_path: Path) -> Path:
    (tmp_path / "records").mkdir()
    for key, scale in (("base", 1.0), ("half", 0.5)):
        (tmp_path / "records" / f"{key}.json").write_text(json.dumps(_record(key, scale)))
    (tmp_path / "manifest.json").write_text(json.dumps({"variant_keys": ["base", "half"], "baseline": "base",
                                                       "recipe": {"name": "r", "workload": {}}}))
    write_report(tmp_path)
    return tmp_path


def test_every_column_of_every_measurement_is_in_markdown_html_and_csv(rendered: Path) -> None:
    md = (rendered / "report.md").read_text()
    page = (rendered / "report.html").read_text()
    csv = pd.read_csv(rendered / "results.csv")
    rows = [flat_row(json.loads(p.read_text())) for p in sorted((rendered / "records").glob("*.json"))]
    for name, m in all_measurements():
        columns = m.columns_for(rows)
        for col in columns:  # (per-point columns outside the main table: in the table of decode points)
            assert col.summary or m.scope == "point", (name, col.heading, "shown nowhere but the CSV")
            assert col.heading in md, (name, col.heading)
            assert col.heading.replace("–", "–") in page, (name, col.heading)
            assert col.field in csv.columns, (name, col.field)
            if col.compare:
                assert col.compare_field in csv.columns, (name, col.compare_field)
        flat = m.flat(SAMPLES[name]) if not m.derived else m.result.model_fields
        for field in flat:  # every field reaches the CSV (nested ones as parent_child), lists results.jsonl
            in_csv = any(c == field or c.startswith(f"{field}_") for c in csv.columns)
            assert in_csv or isinstance(rows[0].get(field), list), (name, field)
        title = m.title
        assert f"**{title}**" in md, f"no provenance line for {name}"


def test_ratios_and_deltas_follow_the_specs(rendered: Path) -> None:
    csv = pd.read_csv(rendered / "results.csv")
    csv = csv[csv["prompt_tokens"] == 16].set_index("variant")
    assert csv.loc["half", "weight_bytes_ratio"] == pytest.approx(0.5)
    assert csv.loc["half", "perplexity_delta"] == pytest.approx(30.125)
    assert "| half | ok | 2.000 | 0.500 |" in (rendered / "report.md").read_text()


def test_a_column_naming_a_missing_field_fails_at_registration() -> None:
    class Small(Result):
        speed_tokens_per_s: float

    class Broken(Measurement):
        result = Small
        order = 1000
        columns: ClassVar = (Column("speed_tokens_per_sec", "speed"),)

    with pytest.raises(TypeError, match="speed_tokens_per_sec"):
        register("broken", "a typo'd column")(Broken)
    assert "broken" not in MEASUREMENTS


def test_a_measurement_without_a_declared_order_fails_at_registration() -> None:
    class Small(Result):
        speed_tokens_per_s: float

    class Unordered(Measurement):
        result = Small
        columns: ClassVar = (Column("speed_tokens_per_s", "speed"),)

    with pytest.raises(TypeError, match="order = N"):
        register("unordered", "no place in the reports")(Unordered)
    assert "unordered" not in MEASUREMENTS


def test_report_order_is_declared_not_the_import_order() -> None:
    names = [name for name, _ in all_measurements()]
    orders = [MEASUREMENTS[name].cls.order for name in names]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert names[:3] == ["weights", "module_formats", "kv_cache"] and names[-1] == "lm_eval_tasks"


def test_a_record_missing_a_field_is_an_error_not_a_dash(tmp_path: Path) -> None:
    from quantlab import QuantlabError

    record = _record("base", 1.0)
    del record["measurements"]["weights"]["weight_bytes"]
    with pytest.raises(QuantlabError, match="measurement 'weights': field 'weight_bytes': Field required"):
        flat_row(record, "records/base.json")
