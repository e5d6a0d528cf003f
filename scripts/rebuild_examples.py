"""Rebuild every committed example's views from its records, and write its README.md.

    python scripts/rebuild_examples.py [examples/NAME ...]

An example commits its recipe (recipes/NAME.yaml), its records, manifest.json, report.md and this README; the views
a record set rebuilds (report.html, results.jsonl, results.csv, results.parquet) are git-ignored and written here.
The README says what the example shows (the recipe's description), its answer and summary table (from report.md),
the command that measured it, and the machine, versions and dates its records hold."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _summary_block(report: str) -> str:
    """The answer and the summary table (with its notes) as report.md has them."""
    start = report.index("## The answer")
    end = report.index("## Details")
    return report[start:end].replace("## The answer", "## The answer (from report.md)").strip()


def _span(dates: list[str]) -> str:
    dates = sorted(dates)
    return dates[0] if dates and dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}" if dates else "—"


def _machine(records: list[dict]) -> str:
    hosts = sorted({f"{r['fingerprint'].get('cpu_model')}, {r['fingerprint'].get('cpu_threads')} threads"
                    for r in records if r.get("fingerprint")})
    env = next((r.get("environment") for r in records if r.get("environment")), {}) or {}
    first = [((r.get("retimed") or {}).get("first_started_at") or r.get("finished_at") or "")[:10] for r in records]
    return (f"Measured on {'; '.join(hosts) or '—'}, Python {env.get('python', '—')}, "
            f"torch {env.get('torch', '—')}, transformers {env.get('transformers', '—')}; "
            f"{_span([d for d in first if d])}. Timings flagged noisy in the report were taken on a busy machine.")


def _retimed(records: list[dict], command: str) -> str:
    """A sentence on the rows whose timing was taken again, all of them together in interleaved rounds."""
    together = [r for r in records if (r.get("retimed") or {}).get("interleaved")]
    if not together:
        return ""
    rounds = sorted({r["retimed"]["interleaved"]["rounds"] for r in together})
    when = _span([r["finished_at"][:10] for r in together if r.get("finished_at")])
    return (f" The decode timing of {len(together)} of the {len(records)} rows was taken again together, "
            f"{'/'.join(map(str, rounds))} rounds interleaved in one process (`{command} --retime all --rounds "
            f"{rounds[-1]}`), {when}; their quality figures are from the first measurement.")


def readme(folder: Path) -> str:
    manifest = json.loads((folder / "manifest.json").read_text())
    recipe = manifest.get("recipe") or {}
    name = recipe.get("name", folder.name)
    records = [json.loads(p.read_text()) for p in sorted((folder / "records").glob("*.json"))]
    report = (folder / "report.md").read_text()
    description = re.sub(r"\s+", " ", recipe.get("description") or "").strip()
    recipe_file = manifest.get("recipe_file") or f"recipes/{name}.yaml"
    return "\n".join([
        f"# Example: {name}", "", description or "—", "",
        f"Measured with `quantlab run {recipe_file} --out {folder.relative_to(ROOT)}`. {_machine(records)}"
        + _retimed(records, f"quantlab run {recipe_file} --out {folder.relative_to(ROOT)}"), "",
        f"The full report is [report.md](report.md); `python scripts/rebuild_examples.py {folder.relative_to(ROOT)}` "
        "writes report.html (plots, memory breakdown, evidence table) and the tables beside it from the records.", "",
        _summary_block(report), ""])


def rebuild(folder: Path) -> None:
    from quantlab.report import write_report

    write_report(folder.relative_to(ROOT), log=lambda msg: print(f"{folder.name}: {msg}", file=sys.stderr))
    (folder / "README.md").write_text(readme(folder), encoding="utf-8")
    print(folder.relative_to(ROOT))


def main(argv: list[str]) -> int:
    import os

    folders = [Path(a).resolve() for a in argv] or sorted(p for p in (ROOT / "examples").iterdir()
                                                         if (p / "records").is_dir())
    os.chdir(ROOT)  # the reports name their folder as the repository names it: examples/NAME
    for folder in folders:
        rebuild(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
