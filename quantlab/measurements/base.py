"""The measurement interface: a registered class with a typed result, its report columns and its provenance.

A measurement runs on a loaded, quantized variant (``measure``) or is derived from the figures recorded with
its own row (``derive``: never from the run's current state, so a reused row and its report agree). Its
result is a pydantic model whose field names carry units; ``columns`` say how Markdown, HTML, CSV and
``quantlab compare`` show those fields. Register with ``@register(name, summary)`` and declare ``order`` (its place in the reports); a column
naming a field its result does not have, or a missing order, is an error at import time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from ..eval.base import EVALUATIONS
from ..registry import Registry

if TYPE_CHECKING:
    from .context import MeasureContext

MIB = 1 << 20


class Result(BaseModel):
    """Base of measurement results: unknown fields are refused, so a renamed field fails loudly."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Column:
    """How one result field is shown. ``divide_by`` scales before formatting (bytes to MiB); ``spread`` names
    two fields shown in parentheses after the value (p10–p90); ``compare`` adds ``<field>_ratio`` or
    ``<field>_delta`` against the baseline (and against the first run in ``quantlab compare``)."""

    field: str
    heading: str
    spec: str = ".3f"
    divide_by: float = 1.0
    compare: Literal["ratio", "delta"] | None = None
    higher_is_better: bool | None = None
    summary: bool = True  # in the main table (else only in the CSV and the per-point table)
    spread: tuple[str, str] | None = None
    timing: Literal["strike", "blank"] | None = None  # a figure of the timed decode: where the row's timing is noisy,
    # shown struck through ("strike") or left blank ("blank"); its ratio to the baseline is left blank either way

    @property
    def compare_field(self) -> str | None:
        return f"{self.field}_{self.compare}" if self.compare else None


Scope = Literal["variant", "point"]


class Measurement:
    """Base of registered measurements."""

    result: ClassVar[type[Result]]
    order: ClassVar[int]  # place in the reports' columns and sections, and in the order measurements run (lowest first)
    scope: ClassVar[Scope] = "variant"
    derived: ClassVar[bool] = False  # computed from the row's own recorded inputs when views are built
    columns: ClassVar[tuple[Column, ...]] = ()
    title: ClassVar[str] = ""  # the figure's name in "how these figures were obtained"
    section: ClassVar[str | None] = None  # a heading: the columns get a table of their own instead of the main one
    evaluation: ClassVar[type[Any] | None] = None  # the config of the recipe's evaluations entry that runs it
    # its figures are the timed steps' only: an interleaved re-timing (several variants held in one process) measures
    # it again and keeps the point's other figures (memory peaks, which other variants in the process would inflate)
    timing_only: ClassVar[bool] = False

    def enabled(self, recipe: Any) -> bool:
        """Whether the recipe runs this measurement: always, or where its evaluation entry is given."""
        return self.evaluation is None or bool(recipe.evaluations.get(self.name))

    @property
    def name(self) -> str:
        return MEASUREMENTS.name_of(type(self))

    def measure(self, ctx: "MeasureContext", point: tuple[int, int] | None = None) -> Result | None:
        """The result for this variant (``point``: the (batch, prompt) point of a point-scope measurement)."""
        raise NotImplementedError

    def derive(self, row: dict[str, Any]) -> Result | None:
        """A derived measurement's result from the flat row (or point) it belongs to; None if inputs are missing."""
        raise NotImplementedError

    def flat(self, result: dict[str, Any]) -> dict[str, Any]:
        """The result as flat view fields (results.jsonl, CSV); optional fields left empty are left out."""
        return {k: v for k, v in result.items() if v is not None}

    def unflat(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """This measurement's result from a flat row (the inverse of ``flat``; reads older results.jsonl rows)."""
        found = {k: row[k] for k in self.result.model_fields if row.get(k) is not None}
        return found or None

    def columns_for(self, rows: list[dict[str, Any]]) -> list[Column]:
        """The columns to show for these rows (fixed by default; lm-eval's depend on the tasks run)."""
        return list(self.columns)

    def provenance(self, row: dict[str, Any], rows: list[dict[str, Any]], manifest: dict[str, Any]) -> str | None:
        """One sentence: how the figures of the first measured row were obtained (None: nothing to say)."""
        return None

    def reads_kv_cache(self, row: dict[str, Any]) -> bool | None:
        """Whether the row's figures of this measurement went through its KV cache. None: the figures do not
        judge quality (bytes, timings); False: a quality figure the KV format cannot change (the views then leave
        it out for rows whose KV format is not the baseline's, instead of repeating the twin's figure)."""
        return None

    def alert(self, row: dict[str, Any]) -> str | None:
        """A line for the run's log when a just-measured row (point-scope: a decode point) calls for attention."""
        return None


MEASUREMENTS: Registry[Measurement] = Registry("measurement")


def engine_notes(rows: list[dict[str, Any]], figure: str) -> str:
    """What each engine that measured some of ``rows`` says of how it obtained ``figure`` (latency, weights)."""
    from ..engine import ENGINES

    names = dict.fromkeys(str(r.get("engine")) for r in rows if r.get("status") == "ok" and r.get("engine"))
    return "".join(ENGINES[n].build().note(rows, figure) for n in names if n in ENGINES)  # type: ignore[arg-type]


def check_columns(name: str, cls: type[Measurement]) -> None:
    """Every column and spread names a field of the measurement's result model, and the class declares its order."""
    if not isinstance(getattr(cls, "order", None), int):
        raise TypeError(f"measurement {name}: declare its place in the reports as a class attribute 'order = N'")
    fields = set(cls.result.model_fields)
    for col in cls.columns:
        for f in (col.field, *(col.spread or ())):
            if f not in fields:
                raise TypeError(f"measurement {name}: column {col.heading!r} names {f!r}, which "
                                f"{cls.result.__name__} does not have (fields: {', '.join(sorted(fields))})")


def register(name: str, summary: str):
    """``@register("latency", "...")``: add a measurement class to ``MEASUREMENTS`` after checking its columns."""

    def wrap(cls: type[Measurement]) -> type[Measurement]:
        check_columns(name, cls)
        MEASUREMENTS.add(name, cls, summary)
        if cls.evaluation is not None:  # the recipe's evaluations.<name> entry that switches it on
            EVALUATIONS.add(name, cls.evaluation, summary)
        return cls

    return wrap


def enabled_measurements(recipe: Any) -> list[tuple[str, Measurement]]:
    """(name, instance) of every measurement the recipe enables, in their declared order."""
    return [(name, m) for name, m in all_measurements() if m.enabled(recipe)]


def all_measurements() -> list[tuple[str, Measurement]]:
    """(name, instance) of every registered measurement, in their declared ``order`` (ties by name)."""
    entries = sorted(MEASUREMENTS.entries(), key=lambda e: (e.cls.order, e.name))
    return [(e.name, e.build()) for e in entries]
