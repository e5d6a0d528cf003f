"""report.md: the answer, a summary table that reads in a terminal, then the details, every figure with how it was
obtained."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .headline import Headline
from .paired import floor_lines, paired_lines
from .summary import Summary
from .table import Section, Struck, cells, first_ok, has_metric, header, pareto_variants, point_section, sections
from .text import exports_section, gguf_note, how_obtained, kv_unread_note, machines_note, software_line


def _md_cells(values: list[str]) -> list[str]:
    """Cells as Markdown: a struck timing struck through, pipes escaped."""
    return [(f"~~{v}~~" if isinstance(v, Struck) else v).replace("|", "\\|") for v in values]


def _md_table(head: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(c) + " |" for c in body)]


def _table(frame: pd.DataFrame, section: Section) -> list[str]:
    head = ["variant", "status", *header(section)]
    body = []
    for _, r in frame.iterrows():
        if r.get("status") != "ok":
            body.append([r["variant"], f"**failed**: {r.get('error')}", *[""] * (len(head) - 2)])
        else:
            body.append([r["variant"], "ok", *_md_cells(cells(r.get, section))])
    return _md_table(head, body)


def _points_table(rows: list[dict[str, Any]]) -> list[str]:
    """Decode figures at every (batch, prompt) point, when the workload has more than one."""
    if not any(len(r.get("decode_points") or []) > 1 for r in rows):
        return []
    section = point_section(rows)
    body = [[r["variant"], str(p["batch_size"]), str(p["prompt_tokens"]), *_md_cells(cells(p.get, section, compare=False))]
            for r in rows if r.get("status") == "ok" for p in r.get("decode_points") or []]
    return ["", "## Decode by batch size and context length", "",
            *_md_table(["variant", "batch", "prompt tokens", *header(section, compare=False)], body)]


def _section_tables(frame: pd.DataFrame, parts: list[Section]) -> list[str]:
    out = []
    for section in parts:
        ok = frame[frame["status"] == "ok"]
        body = [[r["variant"], *_md_cells(cells(r.get, section))] for _, r in ok.iterrows()]
        out += ["", f"## {section.heading}", "", *_md_table(["variant", *header(section)], body)]
    return out


def _pareto_line(frame: pd.DataFrame) -> list[str]:
    if not has_metric(frame):
        return []
    front = [v for v, on in pareto_variants(frame).items() if on]
    return ["", f"◆ Pareto front of perplexity against weights + KV-cache bytes: {', '.join(front)}. "
            "Plots, the memory breakdown and the evidence table: [report.html](report.html)."]


def _paired(frame: pd.DataFrame, rows: list[dict[str, Any]]) -> list[str]:
    """The noise floor and the paired comparisons along the divergence front, where the run has them."""
    out = [line for floor in floor_lines(rows) for line in ("", floor)]
    lines = paired_lines(frame, rows)
    if lines:
        out += ["", lines[0], "", *(f"- {line}" for line in lines[1:])]
    return out


def headline_lines(head: Headline) -> list[str]:
    """The answer as a Markdown list, with the rules it was derived by."""
    lines = ["## The answer", ""]
    lines += [f"- **{a.title}**: {a.text}" for a in head.answers]
    return [*lines, "", f"Rules: {head.rule_text}"]


def summary_lines(table: Summary) -> list[str]:
    """The compact table (variant, bytes, quality, speed) with its numbered notes."""
    body = []
    for r in table.rows:
        name = r.variant + (" ◆" if r.front else "") + (" (baseline)" if r.baseline else "") + \
            "".join(f" [{n}]" for n in r.notes)
        if not r.ok:
            body.append([f"{r.variant} **failed**", f"{r.error}", *[""] * (len(table.headings) - 2)])
            continue
        body.append(_md_cells([name, *(Struck(c.text) if c.struck else c.text for c in r.cells)]))
    notes = [f"[{i}] {text}." for i, text in enumerate(table.footnotes, 1)]
    return [*_md_table(table.headings, body), *(["", *notes] if notes else [])]


def render(frame: pd.DataFrame, rows: list[dict[str, Any]], manifest: dict[str, Any], head: Headline,
           table: Summary, banner: str | None) -> str:
    recipe = manifest.get("recipe", {})
    ok = first_ok(rows)
    main, *own = sections(rows)
    lines = [
        f"# quantlab report: {recipe.get('name', ok.get('recipe', '?'))}",
        "",
        *([recipe["description"], ""] if recipe.get("description") else []),
        f"Model **{ok.get('model', '?')}** on **{ok.get('device', '?')}**; baseline **{manifest.get('baseline')}**; "
        f"{len(rows)} variants."
        + ("" if manifest.get("complete", True) else "  \n**Incomplete run**: some variants have not been measured yet."),
        *machines_note(rows),
        *gguf_note(manifest),
        "",
        *headline_lines(head),
        "",
        *([f"**Timing:** {banner}", ""] if banner else []),
        *summary_lines(table),
        *_pareto_line(frame),
        *_paired(frame, rows),
        *kv_unread_note(rows),
        "",
        "## Details",
        "",
        *_table(frame, main),
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
