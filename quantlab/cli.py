"""The ``quantlab`` command: run | report | formats."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import QuantlabError


def _run(args: argparse.Namespace) -> int:
    from .recipe import load_recipe
    from .runner import run_recipe

    recipe = load_recipe(args.recipe)
    out = run_recipe(recipe, args.out)
    print(out / "report.md")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import write_report

    if not Path(args.dir).is_dir():
        raise QuantlabError(f"{args.dir}: no such results folder")
    print(write_report(Path(args.dir)))
    return 0


def _formats(args: argparse.Namespace) -> int:
    from .kv import KV_FORMATS
    from .quant import WEIGHT_FORMATS

    for registry in (WEIGHT_FORMATS, KV_FORMATS):
        print(f"{registry.kind}s:")
        for entry in registry.entries():
            fixed = ", ".join(f"{k}={v}" for k, v in entry.fixed.items())
            print(f"  {entry.name:<10} {entry.summary}" + (f" [{fixed}]" if fixed else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantlab",
        description="Compare weight and KV-cache formats of a causal LM: memory, decode latency, perplexity.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a recipe and write its report",
                         description="Apply each variant of a recipe, measure it, and write results and a report. "
                         "Variants already finished in the output folder are skipped (resume).")
    run.add_argument("recipe", help="recipe YAML file")
    run.add_argument("--out", type=Path, default=None, help="output folder (default: reports/<recipe name>)")
    run.set_defaults(func=_run)
    report = sub.add_parser("report", help="rebuild report.md and results.csv from results.jsonl",
                            description="Rebuild the report of a finished or interrupted run from its results.jsonl.")
    report.add_argument("dir", help="a run's output folder")
    report.set_defaults(func=_report)
    formats = sub.add_parser("formats", help="list the registered weight and KV-cache formats",
                             description="List every registered weight and KV-cache format with one line each.")
    formats.set_defaults(func=_formats)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except QuantlabError as e:
        print(f"quantlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quantlab: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
