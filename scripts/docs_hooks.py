"""mkdocs hook: the reference pages (docs/reference/) are generated from quantlab's registries and argument parser
before every build (``quantlab.reference``), so they cannot drift from the code; they are not committed."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def on_pre_build(config: Any) -> None:
    from quantlab.cli import build_parser
    from quantlab.entrypoints import quiet_import_noise
    from quantlab.reference import reference_pages

    quiet_import_noise()
    folder = Path(config["docs_dir"]) / "reference"
    folder.mkdir(exist_ok=True)
    for name, text in reference_pages(build_parser()).items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:  # unchanged pages keep serve from looping
            path.write_text(text, encoding="utf-8")
