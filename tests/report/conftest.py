import json
from pathlib import Path

import pytest

MIB = 1 << 20
PROTOCOL = {"name": "windows", "window_tokens": 64, "stride_tokens": 64, "scored_tokens": 100, "text": "t",
            "text_sha256": "0" * 64}


def _point(p: int, ms: float) -> dict:
    return {"batch_size": 1, "prompt_tokens": p, "measurements": {
        "latency": {"engine": "eager", "engine_options": {}, "prefill_ms": 1.0, "decode_ms_per_token": ms * (1 + p / 256),
                    "decode_ms_p10": ms * 0.9, "decode_ms_p90": ms * 1.2, "decode_steps": 5,
                    "decode_ms_samples": [ms * f for f in (0.9, 1.0, 1.0, 1.1, 1.2)], "tokens_per_s": 1000 / ms},
        "kv_cache": {"kv_cache_bytes": 1000 * p, "kv_cache_bytes_analytic": 1000 * p, "kv_cache_tokens": p + 5},
        "peak_memory": {"peak_memory_bytes": 0, "peak_prefill_bytes": 0, "peak_decode_bytes": 0,
                        "peak_memory_method": "process peak RSS"}}}


def make_row(variant: str, weight_mib: float, ppl: float | None, ms: float, status: str = "ok", **extra) -> dict:
    """A complete record, as a run writes it, with hand-picked figures (``extra``: identity fields, or lm-eval
    metrics ``lm_eval_<task>_<metric>`` with ``lm_eval_tasks``)."""
    record = {"record_version": 2, "variant": variant, "variant_key": variant.replace("/", "_"), "status": status, "error": None,
              "recipe": "hand", "device": "cpu (2 threads)", "model": "m", "weight_format": variant, "kv_format": "native",
              "fingerprint_id": "f" * 16, "fingerprint": {"host": "here"}, "sweep": 0,
              "memory_bandwidth_bytes_per_s": 20_000_000_000, "memory_bandwidth_method": "copy",
              "measurements": {}, "points": []}
    tasks = extra.pop("lm_eval_tasks", None)
    metrics = {k: extra.pop(k) for k in list(extra) if k.startswith("lm_eval_")}
    record.update(extra)
    if status != "ok":
        record["error"] = extra.get("error", "boom")
        return record
    wb = int(weight_mib * MIB)
    record["measurements"]["weights"] = {
        "weight_bytes": wb, "weight_bytes_analytic": wb, "weight_bytes_estimate": wb, "weight_bytes_quantized_linear": 0,
        "weight_bytes_linear": wb, "weight_bytes_embedding": 0, "weight_bytes_other": 0, "decode_weight_bytes_read": wb,
        "quantized_modules": 0, "kernel_path": "dense", "quantize_s": 0.1}
    if ppl is not None:
        record["measurements"]["perplexity"] = {"perplexity": ppl, "perplexity_protocol": PROTOCOL}
    if tasks:
        record["measurements"]["lm_eval_tasks"] = {"lm_eval_tasks": [
            {**t, "metrics": {k.removeprefix(f"lm_eval_{t['task']}_"): v for k, v in metrics.items()}} for t in tasks]}
    record["points"] = [_point(p, ms) for p in (16, 64)]
    for point in record["points"]:
        point["measurements"]["peak_memory"].update(
            peak_memory_bytes=int((weight_mib + 50) * MIB), peak_prefill_bytes=int((weight_mib + 50) * MIB),
            peak_decode_bytes=int((weight_mib + 40) * MIB))
    return record


def write_run(folder: Path, name: str, rows: list[dict], baseline: str | None = None) -> Path:
    (folder / "records").mkdir(parents=True, exist_ok=True)
    for r in rows:
        (folder / "records" / f"{r['variant_key']}.json").write_text(json.dumps(r))
    manifest = {"recipe": {"name": name, "workload": {"new_tokens": 5, "warmup_runs": 1}}, "complete": True,
                "baseline": baseline or rows[0]["variant"], "variant_keys": [r["variant_key"] for r in rows],
                "model_evidence": [{"meaning": "layers", "value": 6, "kind": "file", "source": "num_hidden_layers"}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def hand_run(tmp_path: Path) -> Path:
    rows = [make_row("fp32", 19.0, 58.5, 4.0), make_row("bf16", 9.5, 58.5, 3.7), make_row("int8", 5.8, 58.54, 2.9),
            make_row("int4", 4.0, 58.78, 2.4), make_row("int4-slow", 4.5, 59.0, 5.0),
            make_row("int2", 0, None, 0, status="failed", error="UnsupportedError: no kernel for 2 bits")]
    return write_run(tmp_path / "run", "hand", rows)
