"""Exporters: a quantized model written in another ecosystem's format, from the numbers it holds.

An exporter re-quantizes nothing. It reads each quantized linear's stored form back from its kernel
(``Kernel.stored()``: codes, scales and zero points as measured, whatever the layout) and writes those; a
module whose numbers the target cannot hold is a one-line refusal naming the module and what would export.
``export_`` is the library call, ``quantlab export`` and a recipe's ``export:`` the others.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ...errors import UnsupportedError
from ...registry import Registry
from ..embedding import BlockEmbedding
from ..linear import QuantizedLinear
from ..tensors.affine import QuantizedTensor
from ..tensors.base import WeightTensor
from ..tensors.float_zero import FloatZeroTensor
from ..tensors.primitives import pack

MANIFEST = "quantlab-export.json"  # what was written, per tensor, beside the exported files


@dataclass
class LinearWeight:
    """A quantized linear as an exporter sees it: its stored form (``[out, in]``) and bias."""

    name: str
    stored: WeightTensor
    bias: torch.Tensor | None
    settings: dict[str, Any]


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

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        """Write ``model``, whose quantized ``linears`` (read back once, none refused) it is given, into
        ``folder``; ``source`` is the model's own file or folder where known (a GGUF file's metadata and
        tokenizer are copied from it), ``tokenizer`` the loaded tokenizer."""
        raise NotImplementedError

    def check_available(self) -> None:
        """Raise a one-line error when a package this target writes with is missing."""

    def refusal(self, module: LinearWeight) -> str | None:
        """Why ``module``'s stored numbers cannot be written in this format (naming what would), or None."""
        raise NotImplementedError


EXPORTERS: Registry[Exporter] = Registry("export target")


def per_module_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """The ``targets`` whose layout gives each module its own setting, so a per-module mix can be written."""
    return tuple(t for t in targets if not EXPORTERS[t].cls.one_setting)


def quantized_linears(model: nn.Module) -> list[LinearWeight]:
    """Every quantized linear of ``model`` with the stored form its kernel holds (and a token embedding held in
    blocks of its own, ``BlockEmbedding``, as one more weight of the model's). A linear that multiplies its
    input by a scale (AWQ's, where it could not be folded) is refused: no target stores that scale."""
    linears = []
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            if module.input_scale is not None:
                raise UnsupportedError(f"{name} multiplies its input by a scale (AWQ, not folded into the layer "
                                       "before), which no export target holds; quantize it with a format that "
                                       "folds its scales or without AWQ")
            try:
                stored = module.kernel.stored()
            except UnsupportedError as e:
                raise UnsupportedError(f"{name}: {e}") from None
            linears.append(LinearWeight(name, stored, None if module.bias is None else module.bias.data,
                                        module.settings))
        elif isinstance(module, BlockEmbedding) and not module.tied:  # a tied one is written as its head
            linears.append(LinearWeight(name, module.stored(), None, {"method": "gguf", "embedding": True}))
    return linears


def export_(model: nn.Module, to: str, path: str | Path, tokenizer: Any | None = None,
            source: str | Path | None = None) -> ExportResult:
    """Write the quantized ``model`` as ``to`` (``quantlab formats`` lists the targets) into the folder ``path``,
    with a manifest (``quantlab-export.json``) of every tensor's written type and its deviation from the
    numbers the model holds. ``source``: the file or folder the model was loaded from (a GGUF file's metadata
    and tokenizer are carried over). Every module is checked before anything is written."""
    exporter = EXPORTERS[to].build()
    exporter.check_available()
    linears = quantized_linears(model)
    for linear in linears:
        problem = exporter.refusal(linear)
        if problem:
            raise UnsupportedError(f"{linear.name}: {problem}")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    result = exporter.write(model, linears, folder, tokenizer, None if source is None else Path(source))
    (folder / MANIFEST).write_text(json.dumps(result.manifest(), indent=2, default=str))
    return result


def untied_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each storage once, under its first name (tied weights: the input embedding's), detached,
    contiguous and on the CPU, as safetensors writes them."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        ptr = value.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            out[key] = value.detach().cpu().contiguous()
    return out


def other_tensors(model: nn.Module, linears: list[LinearWeight]) -> dict[str, torch.Tensor]:
    """The model's tensors outside its quantized linears (embeddings, norms, unquantized linears), untied."""
    names = {lw.name for lw in linears}

    def inside(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in names for i in range(1, len(parts)))

    return untied_tensors({k: v for k, v in model.state_dict().items() if not inside(k)})


def integer_form(q: WeightTensor) -> QuantizedTensor | None:
    """``q`` as integer codes with integer zero points (HQQ's float zero points where every one is a whole
    number), or None when it has no such form."""
    if isinstance(q, QuantizedTensor):
        return q
    if isinstance(q, FloatZeroTensor):
        z = q.zeros.float()
        if torch.equal(z, torch.round(z)) and bool(((z >= 0) & (z < (1 << q.bits))).all()):
            return QuantizedTensor(q.packed, q.scales, pack(z.to(torch.uint8), q.bits), q.shape, q.bits, q.group_size)
    return None


def scale_cast_deviation(q: QuantizedTensor, dtype: torch.dtype) -> float:
    """Largest change to the weight from writing its scales as ``dtype`` (0 where the cast is exact)."""
    written = dataclasses.replace(q, scales=q.scales.to(dtype))
    return float((written.dequantize() - q.dequantize()).abs().max())


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")


def write_checkpoint(model: nn.Module, folder: Path, tensors: dict[str, torch.Tensor], qconfig: dict[str, Any],
                     tokenizer: Any | None, source: Path | None = None) -> list[str]:
    """A transformers checkpoint folder: ``model.safetensors``, ``config.json`` carrying ``qconfig`` as its
    ``quantization_config``, and the tokenizer: the loaded one, else the source folder's tokenizer files
    (GPTQModel loads a folder only with its tokenizer). Returns the names of the files written."""
    from ...files import save_safetensors

    save_safetensors(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = qconfig
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    files = ["model.safetensors", "config.json"]
    if tokenizer is not None:
        files += [Path(f).name for f in tokenizer.save_pretrained(folder)]
    elif source is not None and source.is_dir():
        import shutil

        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, folder / name)
                files.append(name)
    return files


def weights_digest(model: nn.Module) -> str | None:
    """A SHA-256 of every quantized linear's stored bytes as its kernel holds them (None: nothing quantized), so an
    export can show that the model it writes holds the numbers a run measured."""
    import hashlib

    digest = hashlib.sha256()
    found = False
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            found = True
            digest.update(f"{name}:{module.kernel_path}".encode())
            for key, t in module.state_dict().items():
                if t.device.type == "meta":
                    continue
                digest.update(key.encode())
                digest.update(t.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32] if found else None
