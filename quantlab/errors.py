"""Exceptions that carry a one-line message for the user."""
from __future__ import annotations


def first_line(e: BaseException, default: str | None = None) -> str:
    """The first line of an exception's message (``default``, else the exception's type name, when it has none)."""
    text = str(e).strip()
    if text:
        return text.splitlines()[0]
    return type(e).__name__ if default is None else default


class QuantlabError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits with status 2."""


class RecipeError(QuantlabError):
    """A recipe that cannot be used, with the file and the field path that are wrong."""

    def __init__(self, file: str, field: str, message: str) -> None:
        self.file, self.field, self.message = file, field, message
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {message}")


class UnsupportedError(QuantlabError):
    """A format that cannot be applied to this tensor or model (shape, dtype, device)."""
