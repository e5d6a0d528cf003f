"""The estimate as Markdown: evidence table, projections, parameters, weight payload, KV cache, assumptions."""
from __future__ import annotations

from .worksheet import GB, GIB, Estimate


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _bytes(n: int | None) -> list[str]:
    if n is None:
        return ["—", "—", "—"]
    return [f"{n:,}", f"{n / GB:.3f}", f"{n / GIB:.5f}"]


def _beyond_limit(est: Estimate) -> list[str]:
    """A note when the positions asked for exceed the config's position limit."""
    note = est.beyond_position_limit()
    return [f"**Note**: {note}.", ""] if note else []


def render_estimate(est: Estimate, extra: list[str] | None = None) -> str:
    """The worksheet as Markdown; ``extra``: lines of further sections (the fit plan) before the assumptions."""
    a = est.architecture
    lines = [f"# Estimate: {est.source}", "",
             f"model_type `{a.model_type}`" + (f", transformers `{a.config_class}`" if a.config_class else "")
             + f"; batch {est.batch_size}, {est.seq_len_tokens:,} positions, unquantized tensors in {est.dtype}.", "",
             *_beyond_limit(est), "## Evidence", ""]
    lines += _table(["meaning", "value", "source", "where"], [[e.meaning, f"{e.value}", e.kind, e.source] for e in a.evidence])
    if a.not_interpreted:
        lines += ["", "**Not interpreted** (no field, default or rule establishes these; nothing was guessed):", ""]
        lines += [f"- {item}" for item in a.not_interpreted]
    if a.hidden_size and a.num_attention_heads and a.num_key_value_heads and a.head_dim:
        d, q, kv = a.hidden_size, a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
        lines += ["", "## Projections", "",
                  f"Logical, from the evidence: q {d}→{q}, k and v {d}→{kv}, o {q}→{d} "
                  f"({a.num_attention_heads // a.num_key_value_heads} query head(s) per KV pair)."]
    inv = est.inventory
    if inv is not None and inv.projections:
        stored = ", ".join(f"{name} {i}→{o}" for name, (i, o) in inv.projections.items())
        lines += ["", f"As the implementation stores them (first layer): {stored}."]
    if inv is not None:
        total = inv.param_count
        lines += ["", "## Parameters", "", f"{total:,} parameters; {inv.source}"
                  + ("; tied embedding and head counted once." if a.tie_word_embeddings else "."), ""]
        lines += _table(["component", "parameters", "share"],
                        [[c, f"{n:,}", f"{n / total:.1%}"] for c, n in inv.params_by_component().items() if n])
    if est.weights:
        lines += ["", "## Weight payload", ""]
        rows = []
        for w in est.weights:
            bits = w.bits_per_quantized_weight
            rows.append([w.label, *_bytes(w.bytes), "—" if bits is None else f"{bits:.3f}",
                         f"{w.quantized_params:,}", w.unquantized_dtype])
        lines += _table(["format", "bytes", "GB", "GiB", "bits per linear weight", "linear weights", "other tensors in"], rows)
        lines += ["", "Bits per linear weight include scales, zero points and group indices in the format's layout."]
        if inv is not None and inv.buffers:
            n = sum(numel for _, numel, _ in inv.buffers)
            lines += [f"Bytes include {len(inv.buffers)} non-parameter buffers ({n:,} elements, e.g. "
                      f"`{inv.buffers[0][0]}`) that the model holds beside its parameters."]
    lines += ["", f"## KV cache (batch {est.batch_size}, {est.seq_len_tokens:,} positions)", ""]
    rows = []
    for k in est.kv:
        retained_bytes, _, retained_gib = _bytes(k.bytes_retained)
        rows.append([k.label, *_bytes(k.bytes_full), retained_bytes, retained_gib, k.note])
    lines += _table(["format", "full bytes", "GB", "GiB", "retained bytes", "retained GiB", "note"], rows)
    formula = est.kv_formula()
    if formula:
        lines += ["", f"For unquantized storage with b = bytes per element of {est.dtype}:", "", "```", formula, "```"]
    lines += extra or []
    lines += ["", "## Assumptions", ""] + [f"- {x}" for x in est.assumptions]
    lines += ["", "Estimates, not measurements: `quantlab run` measures the same quantities and reports them beside these."]
    return "\n".join(lines) + "\n"
