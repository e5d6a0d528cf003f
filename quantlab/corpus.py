"""The standard-library corpus: text that every Python installation carries.

Documents are ``pydoc_data.topics`` entries and module/class/function docstrings
of the standard library. Each document has a source name (topic key or module
name); the train/held-out split is a hash of that name, so a module's text is
never on both sides.
"""
from __future__ import annotations

import ast
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

Split = Literal["train", "heldout"]
HELDOUT_PERCENT = 10
MIN_DOCSTRING_CHARS = 200
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}


@dataclass(frozen=True)
class Document:
    source: str
    text: str


def split_of(source: str) -> Split:
    """Deterministic split by source name (a module or a pydoc topic)."""
    bucket = int(hashlib.sha256(source.encode()).hexdigest(), 16) % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def _topic_documents() -> Iterator[Document]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield Document(f"pydoc_data.topics:{key}", topics[key].strip())


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _docstrings(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                yield doc


def _docstring_documents() -> Iterator[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = _module_name(path, root)
        for doc in _docstrings(tree):
            yield Document(module, doc)


def documents(split: Split | None = None) -> list[Document]:
    """All corpus documents, optionally only one split, in a stable order."""
    docs = [*_topic_documents(), *_docstring_documents()]
    return [d for d in docs if split is None or split_of(d.source) == split]


def text_of(docs: list[Document]) -> str:
    return "\n\n".join(d.text for d in docs)
