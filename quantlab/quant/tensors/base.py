"""The interface every stored weight form shares: a dataclass of tensor fields plus the fields that describe them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


@dataclass(frozen=True)
class Spec:
    """What a stored form holds, described without its tensors: the form's name (``WeightTensor.form``) and the
    fields that decide where it can be written (bits, group_size, symmetric, element ...). A weight format gives
    the specs it will store from its config alone (``WeightFormat.stored_specs``); a stored tensor gives its own
    (``WeightTensor.spec``); codecs answer both (``quant.codecs``)."""

    form: str
    fields: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields.get(key)


class WeightTensor:
    """A 2-D weight ``[out, in]`` in some stored form. Subclasses are dataclasses whose tensor fields
    (``tensor_field_names``) are the stored bytes, ``None`` where absent, and whose other fields describe them
    (``shape`` among them), so moving, holding in a kernel's buffers and rebuilding keep the subclass."""

    shape: tuple[int, int]
    form: ClassVar[str]  # the stored form's name, which codecs are registered under

    def spec(self) -> Spec:
        """This tensor's description for the codecs (its form and deciding fields)."""
        return Spec(self.form)

    def describe(self) -> str:
        """The stored form in a few words, for messages and a layer's repr."""
        return self.form

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        """Fields that hold stored tensors (or ``None``)."""
        raise NotImplementedError

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored tensors by field name (absent ones left out)."""
        return {n: t for n in self.tensor_field_names() if (t := getattr(self, n)) is not None}

    def split(self) -> tuple[dict[str, torch.Tensor | None], dict[str, Any]]:
        """``(tensor fields, other fields)``: ``type(self)(**tensor_fields, **other_fields)`` rebuilds it."""
        names = self.tensor_field_names()
        return ({n: getattr(self, n) for n in names},
                {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in names})

    @property
    def nbytes(self) -> int:
        """Bytes actually held by the stored tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / (self.shape[0] * self.shape[1])

    def layout_nbytes(self) -> int:
        """Bytes this form needs, from its shape and description alone."""
        raise NotImplementedError

    def to(self, device: torch.device | str) -> "WeightTensor":
        """The same tensor (same class) with its storage on ``device``."""
        return dataclasses.replace(self, **{name: t.to(device) for name, t in self.tensors().items()})

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        """The weight ``[out, in]`` as ``dtype``; ``rows`` selects a range of output rows."""
        raise NotImplementedError
