"""The export target interface: an ``Exporter`` writes a quantized model's stored numbers in one ecosystem's
format, module by module through the codec of each module's stored form. Targets are registered in
``EXPORTERS`` (``quant/io/<target>.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ...registry import Registry
from ..tensors.base import WeightTensor
from .base import Codec, codec_for


@dataclass
class LinearWeight:
    """A quantized linear as an exporter sees it: its stored form (``[out, in]``) and bias."""

    name: str
    stored: WeightTensor
    bias: torch.Tensor | None
    settings: dict[str, Any]
    activations: Any = None  # the ActivationFormat its input is rounded by, or None (weight-only)
    input_global_scale: torch.Tensor | None = None  # a static activation rounding's calibrated global scale
    input_transform: nn.Module | None = None  # what its input passes through first (a transform's), or None


@dataclass
class ExportResult:
    """What an export wrote: the folder, its main file, and per tensor the type written and any deviation."""

    to: str
    folder: Path
    files: list[str]
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def max_abs_deviation(self) -> float:
        """The largest difference between a written weight and the one measured (0: the same numbers)."""
        return max((t.get("max_abs_deviation", 0.0) for t in self.tensors.values()), default=0.0)

    def manifest(self) -> dict[str, Any]:
        return {"to": self.to, "files": self.files, "max_abs_deviation": self.max_abs_deviation,
                "notes": self.notes, "tensors": self.tensors}


class Exporter:
    """Writes a model quantized by quantlab in one target format. Subclasses are registered in ``EXPORTERS``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    one_setting: ClassVar[bool] = False  # the layout holds one quantization setting for every layer (no mixes)
    nearest: ClassVar[str] = ""  # the weight formats that write here, named in refusals
    writes_input_rotations: ClassVar[bool] = False  # carries a transform's ``InputRotation`` beside the weights

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        """Write ``model``, whose quantized ``linears`` (read back once, none refused) it is given, into
        ``folder``; ``source`` is the model's own file or folder where known (a GGUF file's metadata and
        tokenizer are copied from it), ``tokenizer`` the loaded tokenizer."""
        raise NotImplementedError

    def check_available(self) -> None:
        """Raise a one-line error when a package this target writes with is missing."""

    def codec(self, q: WeightTensor) -> Codec:
        """The codec writing ``q``'s stored form here (only asked of modules ``refusal`` let through)."""
        found = codec_for(self.name, q.form)
        if found is None:
            raise KeyError(f"no {self.name} codec for {q.form}")
        return found

    @classmethod
    def activations_refusal(cls, activations: Any) -> str | None:
        """Why a linear whose input is rounded by ``activations`` (an ``ActivationFormat``) cannot be written here,
        or None: the target says how its loaders round that input. Targets holding weights alone refuse all."""
        return f"{cls.name} holds weights alone; its loaders would not round the input to {activations.format}"

    @classmethod
    def input_transform_refusal(cls, transform: nn.Module) -> str | None:
        """Why a linear whose input passes through ``transform`` at run time cannot be written here, or None: the
        target carries it (an ``InputRotation``, where ``writes_input_rotations``)."""
        from ..transforms.base import InputRotation

        if isinstance(transform, InputRotation) and cls.writes_input_rotations:
            return None
        what = "an input rotation" if isinstance(transform, InputRotation) else f"an input transform ({transform})"
        return f"its input passes through {what} at run time, which {cls.name} does not carry ({run_time_note()})"

    def refusal(self, module: LinearWeight) -> str | None:
        """Why ``module``'s stored numbers cannot be written in this format (naming what would), or None: its
        form's codec for this target, asked of the tensor, and the input rounding, asked of the target."""
        if module.activations is not None:
            why = self.activations_refusal(module.activations)
            if why:
                return why
        if module.input_transform is not None:
            why = self.input_transform_refusal(module.input_transform)
            if why:
                return why
        q = module.stored
        found = codec_for(self.name, q.form)
        why = f"{q.describe()} weights have no {self.name} form" if found is None else found.refusal(q)
        return None if why is None else f"{why}; nearest that exports to {self.name}: {self.nearest}"


EXPORTERS: Registry[Exporter] = Registry("export target")


def run_time_note() -> str:
    """Which targets carry a transform's run-time part and which transforms have one that they can carry, from the
    registries (for refusals)."""
    from ..transforms import TRANSFORMS

    targets = [n for n in EXPORTERS.names() if EXPORTERS[n].cls.writes_input_rotations]
    rotating = [n for n in TRANSFORMS.names() if TRANSFORMS[n].cls.rotates_inputs]
    return (f"{', '.join(targets) or 'no target'} carries one input rotation per linear ({', '.join(rotating)}); "
            "transforms that fold entirely into the weights export everywhere")


def per_module_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """The ``targets`` whose layout gives each module its own setting, so a per-module mix can be written."""
    return tuple(t for t in targets if not EXPORTERS[t].cls.one_setting)
