"""The evaluation interface and its registry: each entry of a recipe's ``evaluations:`` section is one registered
evaluation, validated by its own pydantic model, asked before any work what it refuses (``problem``: a missing
package, an unknown task) and which engines it cannot run on (``engine_refusal``). A measurement declares the
evaluation it runs (``Measurement.evaluation``) and its registration registers both, so a new evaluation is one
file and one registration line (``measurements/``)."""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from ..registry import Registry


class Evaluation(BaseModel):
    """Base of evaluation configs: unknown fields refused, frozen, serialized as the recipe writes them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    requires: ClassVar[tuple[str, ...]] = ()  # other evaluations it reads (divergence scores perplexity's text)

    @classmethod
    def parse(cls, value: Any, recipe: dict[str, Any]) -> "Evaluation":
        """The config a recipe's entry gives (``recipe``: the whole recipe mapping, for defaults that depend on it).
        Raises pydantic's ValidationError, or ValueError, naming the field."""
        return cls.model_validate({} if value is None else value)

    @classmethod
    def absent(cls) -> Any:
        """What a recipe without this entry reads for it (None: not run)."""
        return None

    def problem(self) -> tuple[str, str] | None:
        """``(field path below the entry, why)`` when this evaluation cannot run here as written (a package it
        needs, a task that does not exist), asked before any model is loaded; None when it can."""
        return None

    def engine_refusal(self, engine: Any) -> str | None:
        """Why this evaluation cannot run on ``engine`` (a registered ``Engine``), or None."""
        return None


EVALUATIONS: Registry[Evaluation] = Registry("evaluation")
