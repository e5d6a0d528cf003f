"""Name -> format registries. Duplicate names raise; unknown names list the known ones."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .errors import QuantlabError

T = TypeVar("T")


class UnknownNameError(QuantlabError, KeyError):
    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        self.message = f"unknown {kind} '{name}'{hint} (known: {', '.join(known)})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered name: the config class it builds and the fields the name fixes."""

    name: str
    cls: type[T]
    fixed: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    def build(self, **params: Any) -> T:
        clash = sorted(set(params) & set(self.fixed))
        if clash:
            raise QuantlabError(f"'{clash[0]}' is fixed by format '{self.name}'; drop it or use a format that takes it")
        return self.cls(**self.fixed, **params)

    def example(self, **changes: Any) -> T | None:
        """The class's small example instance (its ``example_fields``, less the fields this name fixes, updated
        by ``changes``), or None when it has none (it needs files of its own)."""
        fields = getattr(self.cls, "example_fields", None)
        if fields is None:
            return None
        return self.build(**{**{k: v for k, v in fields.items() if k not in self.fixed}, **changes})


class Registry(Generic[T]):
    """Maps format names to config classes (with presets) for one kind of format."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, cls: type[T], summary: str, **fixed: Any) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._entries[name] = Entry(name, cls, dict(fixed), summary)

    def register(self, name: str, summary: str, **fixed: Any):
        """Class decorator: ``@WEIGHT_FORMATS.register("rtn", "affine round-to-nearest")``."""

        def wrap(cls: type[T]) -> type[T]:
            self.add(name, cls, summary, **fixed)
            return cls

        return wrap

    def __getitem__(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        return list(self._entries.values())

    def name_of(self, cls: type) -> str:
        """The name ``cls`` is registered under (its first)."""
        return next(e.name for e in self._entries.values() if e.cls is cls)

    def canonical_name(self, config: T) -> str:
        """The registered name that builds ``config`` with no fixed fields (its class's own name)."""
        for entry in self._entries.values():
            if entry.cls is type(config) and not entry.fixed:
                return entry.name
        raise KeyError(f"{type(config).__name__} has no registered name without presets")

    def build_entry(self, entry: Any, name_key: str = "format") -> T:
        """A config from its recipe form: ``NAME`` or ``{format: NAME, field: value...}``."""
        params = {name_key: entry} if isinstance(entry, str) else dict(entry) if isinstance(entry, dict) else {}
        name = params.pop(name_key, None)
        if not isinstance(name, str):
            raise ValueError(f"{name_key}: required, a name or {{{name_key}: NAME, field: value...}} (names: "
                             f"{', '.join(self.names())})")
        return self[name].build(**params)

    def nested_entry(self, data: dict[str, Any], key: str, cls: type) -> dict[str, Any]:
        """``{key: ..., format: NAME, field: value...}`` or ``{key: ..., format: {format: NAME, ...}}`` (a recipe's
        override) as ``{key: ..., format: config}``; one whose format is already a ``cls`` as it is."""
        fmt = data.get("format")
        if isinstance(fmt, cls):
            return data
        params = fmt if isinstance(fmt, dict) else {k: v for k, v in data.items() if k != key}
        return {key: data.get(key), "format": self.build_entry(params)}

    def recipe_entry(self, config: T) -> dict[str, Any]:
        """The recipe form of ``config``: its registered name and the fields set away from their defaults."""
        return {"format": self.canonical_name(config),
                **config.model_dump(mode="json", exclude_defaults=True)}  # type: ignore[attr-defined]
