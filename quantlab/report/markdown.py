"""report.md: the tables, rendered from the measurements' column specs, and how every figure was obtained."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .table import Section, cells, first_ok, has_metric, header, pareto_variants, point_section, sections
from .text import exports_section, gguf_note, how_obtained, kv_unread_note, machines_note, software_line


def _md_table(head: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(c) + " |" for c in body)]


def _table(frame: pd.DataFrame, section: Section) -> list[str]:
    head = ["variant", "status", *header(section)]
    body = []
    for _, r in frame.iterrows():
        if r.get("status") != "ok":
            body.append([r["variant"], f"**failed**: {r.get('error')}", *[""] * (len(head) - 2)])
        else:
            body.append([r["variant"], "ok", *cells(r.get, section)])
    return _md_table(head, body)


def _points_table(rows: list[dict[str, Any]]) -> list[str]:
    """Decode figures at every (batch, prompt) point, when the workload has more than one."""
    if not any(len(r.get("decode_points") or []) > 1 for r in rows):
        return []
    section = point_section(rows)
    body = [[r["variant"], str(p["batch_size"]), str(p["prompt_tokens"]), *cells(p.get, section, compare=False)]
            for r in rows if r.get("status") == "ok" for p in r.get("decode_points") or []]
    return ["", "## Decode by batch size and context length", "",
            *_md_table(["variant", "batch", "prompt tokens", *header(section, compare=False)], body)]


def _section_tables(frame: pd.DataFrame, parts: list[Section]) -> list[str]:
    out = []
    for section in parts:
        ok = frame[frame["status"] == "ok"]
        body = [[r["variant"], *cells(r.get, section)] for _, r in ok.iterrows()]
        out += ["", f"## {section.heading}", "", *_md_table(["variant", *header(section)], body)]
    return out


def _pareto_line(frame: pd.DataFrame) -> list[str]:
    if not has_metric(frame):
        return []
    front = [v for v, on in pareto_variants(frame).items() if on]
    return ["", f"Pareto front of perplexity against weights + KV-cache bytes: {', '.join(front)}. "
            "Plots, the memory breakdown and the evidence table: [report.html](report.html)."]


def render(frame: pd.DataFrame, rows: list[dict[str, Any]], manifest: dict[str, Any]) -> str:
    recipe = manifest.get("recipe", {})
    ok = first_ok(rows)
    main, *own = sections(rows)
    lines = [
        f"# quantlab report: {recipe.get('name', ok.get('recipe', '?'))}",
        "",
        *([recipe["description"], ""] if recipe.get("description") else []),
        f"Model **{ok.get('model', '?')}** on **{ok.get('device', '?')}**; baseline **{manifest.get('baseline')}**."
        + ("" if manifest.get("complete", True) else "  \n**Incomplete run**: some variants have not been measured yet."),
        *machines_note(rows),
        *gguf_note(manifest),
        "",
        *_table(frame, main),
        *_pareto_line(frame),
        *kv_unread_note(rows),
        *_section_tables(frame, own),
        *_points_table(rows),
        *exports_section(rows),
        "",
        "## How these figures were obtained",
        "",
        *(f"- **{title}**: {text}" for title, text in how_obtained(rows, manifest)),
        f"- **environment**: {software_line(rows, manifest)}.",
        "",
    ]
    return "\n".join(lines)
