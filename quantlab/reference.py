"""Reference pages generated from the registries and the argument parser, so the documentation cannot drift from
the code: every registered weight format, KV format, engine, evaluation, perplexity protocol and export target with
its fields (type, default, description), and every command with its options. The docs site builds them
(``scripts/docs_hooks.py``); ``reference_pages(parser)`` returns them as ``{file name: Markdown}``."""
from __future__ import annotations

import argparse
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def _type_name(annotation: Any) -> str:
    """A field's type as a reader wants it: ``int | None``, ``float32 | bfloat16``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return " | ".join(_type_name(a) for a in args)
    if origin in (list, tuple, set):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {_type_name(inner[0])}" if inner else "list"
    if origin is dict:
        return "mapping"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "format" if "Format" in annotation.__name__ else "mapping"
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "**required**" if field.default_factory is None else f"`{field.default_factory()}`"
    return f"`{field.default!r}`".replace("None", "null") if field.default is not None else "`null`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def fields_table(cls: type[BaseModel], fixed: dict[str, Any]) -> list[str]:
    """A Markdown table of a config class's fields (those a registered name fixes are marked)."""
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        default = f"fixed: `{fixed[name]!r}`" if name in fixed else _default(field)
        rows.append(f"| `{name}` | {_cell(_type_name(field.annotation))} | {_cell(default)} | "
                    f"{_cell(field.description or '')} |")
    return rows


def registry_page(title: str, intro: str, registry: Any, fields: bool = True) -> str:
    """One page: every registered name, its summary and, for config classes, its fields."""
    lines = [f"# {title}", "", intro, "", "Generated from the registry; `quantlab formats` lists the same names.", ""]
    for entry in registry.entries():
        lines += [f"## `{entry.name}`", "", _cell(entry.summary), ""]
        if entry.fixed:
            base = next((e.name for e in registry.entries() if e.cls is entry.cls and not e.fixed), entry.cls.__name__)
            lines += ["A preset of `" + base + "` with " +
                      ", ".join(f"`{k}: {v}`" for k, v in entry.fixed.items()) + ".", ""]
        if fields and isinstance(entry.cls, type) and issubclass(entry.cls, BaseModel) and entry.cls.model_fields:
            lines += [*fields_table(entry.cls, entry.fixed), ""]
    return "\n".join(lines)


def cli_page(parser: argparse.ArgumentParser) -> str:
    """Every command and option of ``quantlab``, from its argument parser."""
    lines = ["# Command line", "", "Generated from `quantlab`'s argument parser (`quantlab COMMAND --help` prints the "
             "same).", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        lines += [f"## `quantlab {name}`", "", _cell(command.description or ""), "", "| option | help |", "|---|---|"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
            help_text = (action.help or "") % {"default": action.default} if action.help else ""
            choices = f" (choices: {', '.join(map(str, action.choices))})" if action.choices else ""
            lines.append(f"| {flags} | {_cell(help_text + choices)} |")
        if command.epilog:
            lines += ["", _cell(command.epilog)]
        lines.append("")
    return "\n".join(lines)


def reference_pages(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{file name: Markdown}`` of every reference page; ``parser`` is the command line's (``cli.build_parser()``),
    passed in so the library never imports the command line."""
    from .engine import ENGINES
    from .eval.base import EVALUATIONS
    from .eval.perplexity import PERPLEXITY_PROTOCOLS
    from .kv import KV_FORMATS
    from .measurements import MEASUREMENTS  # noqa: F401  (registers the evaluations)
    from .quant import WEIGHT_FORMATS
    from .quant.io import EXPORTERS

    return {
        "weight-formats.md": registry_page(
            "Weight formats", "A recipe's `weights:` entries: `NAME` or `{format: NAME, field: value, ...}`. Every "
            "format also takes `include`, `exclude` and `overrides` (which modules, and which in another format).",
            WEIGHT_FORMATS),
        "kv-formats.md": registry_page(
            "KV-cache formats", "A recipe's `kv_cache:` entries: `NAME` or `{format: NAME, field: value, ...}`.",
            KV_FORMATS),
        "engines.md": registry_page(
            "Engines", "A recipe's `workload.engine`: one name, or a list (every variant measured on each).",
            ENGINES, fields=False),
        "evaluations.md": registry_page(
            "Evaluations", "A recipe's `evaluations:` entries, each validated by its own model. `perplexity` takes "
            "`protocol:` and that protocol's fields (below).", EVALUATIONS) + "\n\n" + registry_page(
            "Perplexity protocols", "`evaluations.perplexity.protocol`; each protocol's own fields.",
            PERPLEXITY_PROTOCOLS).replace("# Perplexity protocols", "## Perplexity protocols", 1).replace(
            "\n## `", "\n### `"),
        "export-targets.md": registry_page(
            "Export targets", "`quantlab export --to NAME` and a recipe's `export: [{variants: [...], to: [NAME]}]`.",
            EXPORTERS, fields=False),
        "cli.md": cli_page(parser),
    }
