import json
from pathlib import Path

import pytest

MIB = 1 << 20


def make_row(variant: str, weight_mib: float, ppl: float | None, ms: float, status: str = "ok", **extra) -> dict:
    if status != "ok":
        return {"variant": variant, "variant_key": variant, "status": status, "error": extra.get("error", "boom"),
                "recipe": "hand", "device": "cpu (2 threads)", "model": "m"}
    points = [{"batch_size": 1, "prompt_tokens": p, "prefill_ms": 1.0, "decode_ms_per_token": ms * (1 + p / 256),
               "decode_ms_p10": ms * 0.9, "decode_ms_p90": ms * 1.2, "tokens_per_s": 1000 / ms,
               "kv_cache_bytes": 1000 * p, "kv_cache_bytes_analytic": 1000 * p, "roofline_share": 0.1}
              for p in (16, 64)]
    row = {"variant": variant, "variant_key": variant, "status": "ok", "error": None, "recipe": "hand",
           "device": "cpu (2 threads)", "model": "m", "weight_bytes": int(weight_mib * MIB),
           "weight_bytes_analytic": int(weight_mib * MIB), "weight_bytes_estimate": int(weight_mib * MIB),
           "peak_memory_bytes": int((weight_mib + 50) * MIB), "kernel_path": "dense",
           "decode_ms_samples": [ms * f for f in (0.9, 1.0, 1.0, 1.1, 1.2)], "decode_points": points,
           "perplexity_protocol": {"name": "windows", "window_tokens": 64, "stride_tokens": 64, "scored_tokens": 100,
                                   "text": "t", "text_sha256": "0" * 64}}
    row.update(points[0])
    if ppl is not None:
        row["perplexity"] = ppl
    row.update(extra)
    return row


def write_run(folder: Path, name: str, rows: list[dict], baseline: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = {"recipe": {"name": name, "workload": {"new_tokens": 5, "warmup_runs": 1}}, "complete": True,
                "baseline": baseline or rows[0]["variant"], "variant_keys": [r["variant_key"] for r in rows],
                "memory_bandwidth_bytes_per_s": 2e10, "memory_bandwidth_method": "copy",
                "model_evidence": [{"meaning": "layers", "value": 6, "kind": "file", "source": "num_hidden_layers"}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def hand_run(tmp_path: Path) -> Path:
    rows = [make_row("fp32", 19.0, 58.5, 4.0), make_row("bf16", 9.5, 58.5, 3.7), make_row("int8", 5.8, 58.54, 2.9),
            make_row("int4", 4.0, 58.78, 2.4), make_row("int4-slow", 4.5, 59.0, 5.0),
            make_row("int2", 0, None, 0, status="failed", error="UnsupportedError: no kernel for 2 bits")]
    return write_run(tmp_path / "run", "hand", rows)
