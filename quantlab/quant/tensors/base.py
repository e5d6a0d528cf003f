"""The interface every stored weight form shares: a dataclass of tensor fields plus the fields that describe them."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch


class WeightTensor:
    """A 2-D weight ``[out, in]`` in some stored form. Subclasses are dataclasses whose tensor fields
    (``tensor_field_names``) are the stored bytes, ``None`` where absent, and whose other fields describe them
    (``shape`` among them), so moving, holding in a kernel's buffers and rebuilding keep the subclass."""

    shape: tuple[int, int]

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

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice = slice(None)) -> torch.Tensor:
        """The weight ``[out, in]`` as ``dtype``; ``rows`` selects a range of output rows."""
        raise NotImplementedError
