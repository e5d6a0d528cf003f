"""The weight-format interface. A format is a frozen, validated config that knows how to apply itself."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..dtypes import DTYPES, SHORT_DTYPE, DtypeName  # noqa: F401  (re-exported for the formats)
from ..registry import Registry



@dataclass
class Calibration:
    """Calibration token ids (each ``[1, seq]``) and, where there is one, the tokenizer that made them."""

    samples: list[torch.Tensor]
    tokenizer: Any | None = None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)


class WeightFormat(BaseModel):
    """Base of every weight format. Subclasses are registered in ``WEIGHT_FORMATS``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    requires_calibration: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """A short name derived from the config (never parsed back)."""
        raise NotImplementedError

    def prepare_model_(self, model: nn.Module) -> None:
        """Whole-model changes made before any module is replaced (e.g. a dtype cast)."""

    def unquantized_dtype(self, base: torch.dtype) -> torch.dtype:
        """The dtype of tensors the format leaves unquantized (embeddings, norms, biases, the head)."""
        return base

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        """Bytes a selected linear weight ``[out, in]`` takes in this format's layout, from its shape alone
        (used by ``quantlab estimate``; a format without a formula is reported as not estimated)."""
        raise NotImplementedError

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module | None:
        """A replacement for a selected linear module, or None to leave it as it is."""
        return None

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        """Replace the ``selected`` linear modules in place; returns per-module details (may be empty).

        The default quantizes each module on its own; calibrated formats override this.
        """
        from .offload import onloaded, placed

        details: dict[str, Any] = {}
        for name in selected:
            old = model.get_submodule(name)
            with onloaded(old):  # an offloaded module's weights are brought in for its quantization only
                new = self.quantize_module(name, old)
            if new is not None:
                model.set_submodule(name, placed(new, old))
                details[name] = {}
        return details


class QuantizedWeightFormat(WeightFormat):
    """A format that replaces linear weights by a stored form and may run the rest of the model in another dtype."""

    compute_dtype: DtypeName | None = Field(default=None, description="activation dtype; null keeps the model's")

    def prepare_model_(self, model: nn.Module) -> None:
        from .offload import cast_

        if self.compute_dtype:
            cast_(model, DTYPES[self.compute_dtype])

    def unquantized_dtype(self, base: torch.dtype) -> torch.dtype:
        return DTYPES[self.compute_dtype] if self.compute_dtype else base

    def compute_dtype_label(self) -> list[str]:
        """The label part naming the compute dtype (none when the model's is kept)."""
        return [SHORT_DTYPE[self.compute_dtype]] if self.compute_dtype else []


WEIGHT_FORMATS: Registry[WeightFormat] = Registry("weight format")
