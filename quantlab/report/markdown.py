"""report.md: the comparison table and how every figure was obtained."""
from __future__ import annotations

from typing import Any

import pandas as pd

from ..measure.perplexity import protocol_summary
from .table import MIB, first_ok, fmt_mib, fmt_value, has_perplexity, pareto_variants, task_rows


def _table(frame: pd.DataFrame) -> list[str]:
    head = ("| variant | status | weights MiB | × base | analytic MiB | config estimate MiB | KV cache MiB | peak MiB | prefill ms "
            "| decode ms/token (p10–p90) | tokens/s | × base | roofline | perplexity | Δ base |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for _, r in frame.iterrows():
        get = r.get
        if get("status") != "ok":
            lines.append(f"| {r['variant']} | **failed**: {get('error')} |" + " |" * 13)
            continue
        decode = f"{fmt_value(get('decode_ms_per_token'), '.2f')} ({fmt_value(get('decode_ms_p10'), '.2f')}–{fmt_value(get('decode_ms_p90'), '.2f')})"
        lines.append(
            f"| {r['variant']} | ok | {fmt_value(get('weight_bytes', 0) / MIB, '.3f')} | {fmt_value(get('weight_bytes_ratio'), '.3f')} "
            f"| {fmt_value(get('weight_bytes_analytic', 0) / MIB, '.3f')} | {fmt_mib(get('weight_bytes_estimate'))} "
            f"| {fmt_value(get('kv_cache_bytes', 0) / MIB, '.3f')} "
            f"| {fmt_value(get('peak_memory_bytes', 0) / MIB, '.1f')} "
            f"| {fmt_value(get('prefill_ms'), '.2f')} | {decode} | {fmt_value(get('tokens_per_s'), '.1f')} "
            f"| {fmt_value(get('tokens_per_s_ratio'), '.2f')} | {fmt_value(get('roofline_share'), '.1%')} "
            f"| {fmt_value(get('perplexity'), '.3f')} | {fmt_value(get('perplexity_delta'), '+.3f')} |"
        )
    return lines


def _points_table(rows: list[dict[str, Any]]) -> list[str]:
    """Decode figures at every (batch, prompt) point, when the workload has more than one."""
    if not any(len(r.get("decode_points") or []) > 1 for r in rows):
        return []
    lines = ["", "## Decode by batch size and context length", "",
             "| variant | batch | prompt tokens | prefill ms | decode ms/token (p10–p90) | tokens/s | KV cache MiB "
             "| KV analytic MiB | KV config estimate MiB | peak MiB | roofline |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for p in r.get("decode_points") or []:
            lines.append(
                f"| {r['variant']} | {p['batch_size']} | {p['prompt_tokens']} | {fmt_value(p.get('prefill_ms'), '.2f')} "
                f"| {fmt_value(p.get('decode_ms_per_token'), '.2f')} ({fmt_value(p.get('decode_ms_p10'), '.2f')}–{fmt_value(p.get('decode_ms_p90'), '.2f')}) "
                f"| {fmt_value(p.get('tokens_per_s'), '.1f')} | {fmt_value(p.get('kv_cache_bytes', 0) / MIB, '.3f')} "
                f"| {fmt_mib(p.get('kv_cache_bytes_analytic'))} | {fmt_mib(p.get('kv_cache_bytes_estimate'))} "
                f"| {fmt_value(p.get('peak_memory_bytes', 0) / MIB, '.1f')} | {fmt_value(p.get('roofline_share'), '.1%')} |")
    return lines


def _tasks_table(frame: pd.DataFrame, baseline: str) -> list[str]:
    cols, rows = task_rows(frame, baseline)
    if not cols:
        return []
    names = [c.removeprefix("lm_eval_") for c in cols]
    lines = ["", "## lm-eval tasks", "", "| variant | " + " | ".join(f"{n} | Δ base" for n in names) + " |",
             "|---|" + "---|---|" * len(names)]
    for variant, values, deltas in rows:
        cells = " | ".join(f"{fmt_value(v, '.4f')} | {fmt_value(d, '+.4f')}" for v, d in zip(values, deltas))
        lines.append(f"| {variant} | {cells} |")
    return lines


def _pareto_line(frame: pd.DataFrame) -> list[str]:
    if not has_perplexity(frame):
        return []
    front = [v for v, on in pareto_variants(frame).items() if on]
    return ["", f"Pareto front of perplexity against weights + KV-cache bytes: {', '.join(front)}. "
            "Plots, the memory breakdown and the evidence table: [report.html](report.html)."]


def render(frame: pd.DataFrame, rows: list[dict[str, Any]], manifest: dict[str, Any]) -> str:
    recipe = manifest.get("recipe", {})
    ok = first_ok(rows)
    env = ok.get("environment") or manifest.get("environment", {})
    w = recipe.get("workload", {})
    lines = [
        f"# quantlab report: {recipe.get('name', ok.get('recipe', '?'))}",
        "",
        *([recipe["description"], ""] if recipe.get("description") else []),
        f"Model **{ok.get('model', '?')}** on **{ok.get('device', '?')}**; baseline **{manifest.get('baseline')}**."
        + ("" if manifest.get("complete", True) else "  \n**Incomplete run**: some variants have not been measured yet."),
        "",
        *_table(frame),
        *_pareto_line(frame),
        *_tasks_table(frame, manifest.get("baseline", "")),
        *_points_table(rows),
        "",
        "## How these figures were obtained",
        "",
        "- **weights MiB**: measured, bytes of every parameter and buffer the model holds after quantization "
        "(packed codes, scales and zero points included; tied tensors counted once). **analytic MiB**: the same "
        "total from each format's bits, group size and metadata, layer by layer on the quantized model. "
        "**config estimate MiB**: predicted from the model's config alone, before loading (`quantlab estimate`: "
        f"{ok.get('estimate_params_source') or 'the module tree'} × the format's byte formula).",
        "- **KV cache MiB**: measured from the cache's tensors after the timed generation "
        f"({ok.get('kv_cache_tokens', '—')} positions); the format's formula gives {fmt_value(ok.get('kv_cache_bytes_analytic'), ',')} "
        f"bytes for the first row, the config estimate {fmt_value(ok.get('kv_cache_bytes_estimate'), ',')}, "
        f"measured {fmt_value(ok.get('kv_cache_bytes'), ',')}.",
        f"- **peak MiB**: the larger of the prefill and decode peaks of that generation; method: {ok.get('peak_memory_method', '—')}.",
        f"- **roofline**: bytes one decode step must read (weights it touches + KV cache at the mean decode length) "
        f"÷ the device's copy bandwidth ({fmt_value(manifest.get('memory_bandwidth_bytes_per_s', float('nan')) / 1e9, '.1f')} GB/s, "
        f"{manifest.get('memory_bandwidth_method', 'not measured')}), as a share of the measured step time.",
        f"- **latency**: engine `{ok.get('engine', 'eager')}` (greedy loop over model.forward with the KV format's cache; "
        f"options {ok.get('engine_options') or '—'}), "
        f"batch {ok.get('batch_size')}, prompt {ok.get('prompt_tokens')} tokens in the main table, {w.get('new_tokens')} decode steps "
        f"after {w.get('warmup_runs')} warm-up generation(s); prefill is the median of {w.get('prefill_repeats')} runs; "
        "decode ms/token is the median step (p10–p90 beside it); the device is synchronized around every timed step. "
        "tokens/s = batch × 1000 / median step.",
    ]
    if ok.get("perplexity_protocol_name") or ok.get("perplexity_protocol"):
        proto = ok.get("perplexity_protocol") or {}
        lines.append(f"- **perplexity**: token perplexity, protocol {protocol_summary(proto)}.")
    kernels = sorted({r.get("kernel_path") for r in rows if r.get("kernel_path")})
    lines += [
        f"- **kernel paths**: {', '.join(kernels) or '—'}.",
        f"- **environment**: Python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"quantlab commit {env.get('quantlab_commit') or 'unknown'}.",
        "",
    ]
    return "\n".join(lines)
