"""What ``quantlab run`` ends with (and ``quantlab report --summary`` prints): the answer as a short table, then
where the reports and exports are."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .headline import Headline

SHORT_TITLES = {"smallest": "smallest within tolerance", "budget": "best within budget",
                "fastest": "fastest trustworthy"}


def _plain(text: str) -> str:
    """A Markdown sentence as terminal text (bold and code marks dropped)."""
    return re.sub(r"\*\*(.+?)\*\*|`(.+?)`", lambda m: m.group(1) or m.group(2), text)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def summary_text(out_dir: Path, rows: list[dict[str, Any]], manifest: dict[str, Any], head: Headline) -> str:
    """The answer's rows, the rules in one line, and the paths of report.html, report.md and the exports."""
    ok = [r for r in rows if r.get("status") == "ok"]
    failed = len(rows) - len(ok)
    name = (manifest.get("recipe") or {}).get("name", "?")
    lines = [f"{name}: {len(ok)} of {len(rows)} variants measured" + (f" ({failed} failed)" if failed else "") +
             f"; baseline {head.baseline}"]
    table = [["answer", "variant", "figures"]]
    for a in head.answers:
        if a.variant is None:
            table.append([SHORT_TITLES[a.key], "—", _plain(a.text)])
        else:
            table.append([SHORT_TITLES[a.key], a.variant, ", ".join(a.figures.values())])
    lines += _table(table)
    lines.append(f"  ({_plain(head.rule_text).split('; trustworthy')[0]}; budget {head.budget_text})")
    noisy = [r["variant"] for r in ok if r.get("noisy")]
    if noisy:
        recipe = manifest.get("recipe_file") or "RECIPE.yaml"
        lines.append(f"timing: {len(noisy)} of {len(ok)} rows were timed on a busy or noisy machine (struck in the "
                     f"reports); to time them again: quantlab run {recipe} --out {out_dir} --retime")
    lines.append(f"report: {out_dir / 'report.html'}")
    lines.append(f"        {out_dir / 'report.md'}")
    folders = [e["folder"] for r in rows for e in r.get("exports") or [] if e.get("folder")]
    for i, folder in enumerate(folders):
        lines.append(("exports: " if i == 0 else "         ") + str(out_dir / folder))
    return "\n".join(lines)
