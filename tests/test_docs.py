"""The reference pages are generated from the registries and the parser, so every registered name and every
command has its entry; help texts that name choices name all of them."""
from __future__ import annotations

import argparse
import re

import pytest

from quantlab.cli import build_parser
from quantlab.reference import reference_pages


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference_pages(build_parser())


def _registries() -> dict[str, object]:
    from quantlab.engine import ENGINES
    from quantlab.eval.base import EVALUATIONS
    from quantlab.eval.perplexity import PERPLEXITY_PROTOCOLS
    from quantlab.kv import KV_FORMATS
    from quantlab.quant import WEIGHT_FORMATS
    from quantlab.quant.io import EXPORTERS
    from quantlab.run.executors import EXECUTORS

    return {"weight-formats.md": WEIGHT_FORMATS, "kv-formats.md": KV_FORMATS, "engines.md": ENGINES,
            "evaluations.md": EVALUATIONS, "export-targets.md": EXPORTERS, "protocols": PERPLEXITY_PROTOCOLS,
            "executors": EXECUTORS}


def test_every_registered_name_has_its_entry_with_its_fields(pages: dict[str, str]) -> None:
    registries = _registries()
    for page in ("weight-formats.md", "kv-formats.md", "engines.md", "evaluations.md", "export-targets.md"):
        for name in registries[page].names():
            assert f"## `{name}`" in pages[page], (page, name)
    for name in registries["protocols"].names():
        assert f"### `{name}`" in pages["evaluations.md"], name
    gptq = pages["weight-formats.md"].split("## `gptq`")[1].split("\n## ")[0]
    assert "| `act_order` | bool | `False` |" in gptq and "| `bits` |" in gptq


def test_every_command_and_option_is_in_the_cli_reference(pages: dict[str, str]) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert f"## `quantlab {name}`" in pages["cli.md"], name
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in pages["cli.md"], (name, flag)


def test_help_that_names_choices_names_every_registered_one() -> None:
    """A help text names none of a registry's choices (it points to quantlab formats) or all of them."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts = {f"{name} {' '.join(a.option_strings)}": a.help or "" for name, command in sub.choices.items()
             for a in command._actions}
    texts.update({name: command.description or "" for name, command in sub.choices.items()})
    for registry in _registries().values():
        names = registry.names()
        for where, text in texts.items():
            text = re.sub(r"\(default: [^)]*\)", "", text)  # a default is a value, not a list of choices
            named = [n for n in names if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", text)]
            if len(named) >= 2:
                assert set(named) == set(names), (where, text, sorted(set(names) - set(named)))
