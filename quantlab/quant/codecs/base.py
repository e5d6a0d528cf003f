"""The codec interface and its registry by (target, stored form)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from ..tensors.base import Spec, WeightTensor


class Codec:
    """Writes one stored form to one export target. ``claims`` answers from a description alone (a weight
    format's config, before any model is loaded); ``refusal`` from the stored tensor, whose shape may still not
    fit (a group that is not whole blocks). Subclasses per target add how the numbers are written."""

    target: ClassVar[str]
    note: ClassVar[str | None] = None  # what a user loading the written files should know (the export's notes)
    writes: ClassVar[bool] = True  # False: registered only to say why the form cannot be written (claims nothing)

    def claims(self, spec: Spec) -> str | None:
        """Why a form described by ``spec`` cannot be written to this target (naming what would), or None."""
        return None

    def refusal(self, q: WeightTensor) -> str | None:
        """Why the stored tensor ``q`` cannot be written, or None (by default: what its spec says)."""
        return self.claims(q.spec())


CODECS: dict[tuple[str, str], Codec] = {}  # (target, form) -> codec


def register_codec(form: str, codec: Codec) -> None:
    """Write the stored form named ``form`` to ``codec.target`` through ``codec`` (one line in a form's folder)."""
    key = (codec.target, form)
    if key in CODECS:
        raise ValueError(f"a codec writing {form} to {codec.target} is already registered")
    CODECS[key] = codec


def codec_for(target: str, form: str) -> Codec | None:
    """The codec writing ``form`` to ``target``, or None."""
    return CODECS.get((target, form))


def codecs_of(target: str) -> dict[str, Codec]:
    """Every form ``target`` has a codec for, by form name."""
    return {form: codec for (t, form), codec in CODECS.items() if t == target}


def targets_holding(specs: Iterable[Spec], targets: Iterable[str]) -> tuple[str, ...]:
    """The ``targets`` (in their order) whose codecs claim every one of ``specs``; none for no specs."""
    specs = list(specs)
    if not specs:
        return ()
    return tuple(t for t in targets
                 if all((c := codec_for(t, s.form)) is not None and c.claims(s) is None for s in specs))
