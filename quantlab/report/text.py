"""Sentences the Markdown and HTML reports share."""
from __future__ import annotations

from typing import Any

from .table import first_ok


def machines_note(rows: list[dict[str, Any]]) -> list[str]:
    """A warning line when the rows were measured under more than one machine fingerprint."""
    ids = {r.get("fingerprint_id") for r in rows if r.get("status") == "ok"} - {None}
    if len(ids) <= 1:
        return []
    hosts = sorted({str(r.get("host")) for r in rows if r.get("status") == "ok"})
    return ["", f"**Rows from {len(ids)} machines** ({', '.join(hosts)}; column `fingerprint_id`): timings and "
            "peak memory compare only within one machine."]


def software_line(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> str:
    env = first_ok(rows).get("environment") or manifest.get("environment", {})
    return (f"Python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
            f"quantlab commit {env.get('quantlab_commit') or 'unknown'}")
