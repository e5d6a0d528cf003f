"""The codec interface of targets that hold integer codes with integer zero points (GPTQ, AWQ)."""
from __future__ import annotations

from typing import Any

from ..tensors.base import Spec, WeightTensor
from .base import Codec, codec_for


class IntegerCodec(Codec):
    """A stored form given to an integer-code target as integer codes, scales and integer zero points: ``layout``
    is the target's own rule on bits and groups, ``shape`` its rule on a tensor's shape."""

    def integer(self, q: WeightTensor) -> tuple[Any | None, str]:
        """``(q as integer codes with integer zero points, "")``, or ``(None, why it has no such form)``."""
        raise NotImplementedError

    def layout(self, spec: Spec) -> str | None:
        """Why the target's layout cannot hold integer codes described by ``spec``, or None."""
        return None

    def shape(self, q: Any) -> str | None:
        """Why the target's layout cannot hold the integer tensor ``q``'s shape, or None."""
        return None

    def claims(self, spec: Spec) -> str | None:
        return self.layout(spec)

    def refusal(self, q: WeightTensor) -> str | None:
        integer, why = self.integer(q)
        if integer is None:
            return why
        return self.layout(integer.spec()) or self.shape(integer)


def as_integer(target: str, q: WeightTensor) -> Any:
    """``q`` as integer codes with integer zero points, through its form's codec for ``target`` (asked of tensors the
    codec's ``refusal`` let through)."""
    codec = codec_for(target, q.form)
    assert isinstance(codec, IntegerCodec), f"no integer codec writes {q.form} to {target}"
    found, why = codec.integer(q)
    if found is None:
        raise ValueError(why)
    return found
