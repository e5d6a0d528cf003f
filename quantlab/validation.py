"""Turn pydantic validation errors into one-line messages with a field path and what is allowed."""
from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def field_path(loc: tuple[Any, ...], prefix: str = "") -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and not part.startswith("function-"):
            path += f".{part}" if path else part
    return path


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [c for arg in typing.get_args(annotation) for c in _model_classes(arg)]


def model_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the last element of ``loc``."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part)
        classes = _model_classes(field.annotation) if field else []
        if not classes:
            return None
        cls = classes[0]
    return cls


def unknown_field_message(name: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown field '{name}'{hint} (allowed: {', '.join(allowed)})"


def describe(error: dict[str, Any], root: type[BaseModel]) -> str:
    """A one-line description of a single pydantic error."""
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        owner = model_at(root, loc)
        return unknown_field_message(str(loc[-1]), list(owner.model_fields) if owner else [])
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        return "required field is missing"
    got = error.get("input")
    if isinstance(got, (str, int, float, bool)) or got is None:
        msg += f" (got {got!r})"
    return msg


def first_error(err: ValidationError, root: type[BaseModel], prefix: str = "") -> tuple[str, str]:
    """(field path, message) of the first error in ``err``."""
    e = err.errors()[0]
    return field_path(tuple(e["loc"]), prefix), describe(e, root)
