"""Sentences the Markdown and HTML reports share."""
from __future__ import annotations

from typing import Any

from ..measurements import all_measurements
from .table import first_ok


def machines_note(rows: list[dict[str, Any]]) -> list[str]:
    """A warning line when the rows were measured under more than one machine fingerprint."""
    ids = {r.get("fingerprint_id") for r in rows if r.get("status") == "ok"} - {None}
    if len(ids) <= 1:
        return []
    hosts = sorted({str(r.get("host")) for r in rows if r.get("status") == "ok"})
    return ["", f"**Rows from {len(ids)} machines** ({', '.join(hosts)}; column `fingerprint_id`): timings and "
            "peak memory compare only within one machine."]


def gguf_note(manifest: dict[str, Any]) -> list[str]:
    """A line for a model read from a GGUF file: its weights were quantized before transformers dequantized them."""
    types = manifest.get("model_gguf_tensor_types")
    if not types:
        return []
    file = ((manifest.get("recipe") or {}).get("model") or {}).get("gguf_file", "the GGUF file")
    counts = ", ".join(f"{n} {t}" for t, n in types.items())
    return ["", f"**Weights read from a GGUF file** ({file}: {counts} tensors) and dequantized by transformers: "
            "every variant re-quantizes weights that were already quantized, which flatters formats close to the "
            "file's own (the baseline is the dequantized file, not the original training weights)."]


def export_items(rows: list[dict[str, Any]]) -> list[tuple[str, str, str | None, str]]:
    """``(variant, target, folder or None, detail)`` for every export a recipe's ``export:`` asked for."""
    items = []
    for r in rows:
        for e in r.get("exports") or []:
            if e.get("folder"):
                deviation = e.get("max_abs_deviation") or 0.0
                detail = "the measured numbers exactly" if deviation == 0 else \
                    f"largest deviation from the measured weights {deviation:.2g} (quantlab-export.json, per tensor)"
                items.append((r["variant"], e["to"], e["folder"], detail))
            else:
                items.append((r["variant"], e["to"], None, f"refused: {e.get('error')}"))
    return items


def exports_section(rows: list[dict[str, Any]]) -> list[str]:
    """The report's list of deployable folders written beside it."""
    items = export_items(rows)
    if not items:
        return []
    return ["", "## Exports", "", *(f"- **{v}** → {to}: " + (f"[{folder}]({folder}), {detail}" if folder else detail)
                                    for v, to, folder, detail in items)]


def kv_unread_note(rows: list[dict[str, Any]]) -> list[str]:
    """A line naming the rows whose quality figures were left out because they did not read their KV cache, what
    was left out, and which of their quality figures did read it (those stand, on their fronts)."""
    left = [r for r in rows if r.get("kv_cache_not_read_by")]
    if not left:
        return []
    names = sorted({n for r in left for n in r["kv_cache_not_read_by"]})
    read = sorted({m.title for _, m in all_measurements() for r in left
                   if m.reads_kv_cache(r) is True and not_missing(r, m)})
    advice = (" A perplexity protocol that reads the cache (`protocol: kv-chunked`) measures them."
              if "perplexity" in names else "")
    stands = f" Their {' and '.join(read)} went through the cache and {'is' if len(read) == 1 else 'are'} shown." \
        if read else ""
    return ["", f"**Quality not measured through the KV cache** for {', '.join(r['variant'] for r in left)}: "
            f"{' and '.join(names)} ran without the cache, so {'its' if len(names) == 1 else 'their'} figures would "
            "repeat the same weights' with the baseline's cache; they are left out (—), and these rows are off the "
            f"front of those figures.{stands}{advice}"]


def software_line(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> str:
    env = first_ok(rows).get("environment") or manifest.get("environment", {})
    return (f"Python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
            f"quantlab commit {env.get('quantlab_commit') or 'unknown'}")


def how_obtained(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(figure, sentence) for every measurement the rows have: each measurement's own provenance."""
    ok = first_ok(rows)
    out = []
    for _, m in all_measurements():
        if not any(not_missing(r, m) for r in rows):
            continue
        text = m.provenance(ok, rows, manifest)
        if text:
            out.append((m.title, text))
    return out


def not_missing(row: dict[str, Any], m: Any) -> bool:
    """Whether the row has any figure of measurement ``m``."""
    if row.get("status") != "ok":
        return False
    places = (row.get("decode_points") or [row]) if m.scope == "point" else [row]
    fields = [c.field for c in m.columns_for([row])] or list(m.result.model_fields)
    return any(p.get(f) is not None for p in places for f in fields)
