"""Names a module exports that load on first use (``module:attribute`` each), so importing it stays cheap."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(module: str, names: dict[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for ``names`` (name -> ``"package.module:attribute"``); a loaded
    value is kept in ``namespace`` (the module's globals), so each loads once."""

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, attribute = names[name].partition(":")
        value = getattr(importlib.import_module(where), attribute)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
