"""Exporters: a quantized model written in another ecosystem's format, from the numbers it holds.

An exporter re-quantizes nothing. It reads each quantized linear's stored form back from its kernel
(``Kernel.stored()``: codes, scales and zero points as measured, whatever the layout) and writes those through
the codec of that form for its target (``quant.codecs``); a module whose numbers the target cannot hold is a
one-line refusal naming the module and what would export.
``export_`` is the library call, ``quantlab export`` and a recipe's ``export:`` the others.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import UnsupportedError
from ..codecs.targets import EXPORTERS, Exporter, ExportResult, LinearWeight, per_module_targets
from ..embedding import BlockEmbedding
from ..linear import QuantizedLinear

__all__ = ["EXPORTERS", "Exporter", "ExportResult", "LinearWeight", "export_", "per_module_targets",
           "quantized_linears", "weights_digest", "write_checkpoint"]

MANIFEST = "quantlab-export.json"  # what was written, per tensor, beside the exported files


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
            rounding = module.input_rounding
            activations = None if rounding is None else rounding.spec
            static = getattr(rounding, "input_global_scale", None) if activations is not None and activations.static \
                else None
            linears.append(LinearWeight(name, stored, None if module.bias is None else module.bias.data,
                                        module.settings, activations, static, module.input_transform))
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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")


def write_checkpoint(model: nn.Module, folder: Path, tensors: dict[str, torch.Tensor],
                     qconfig: dict[str, Any] | None, tokenizer: Any | None, source: Path | None = None) -> list[str]:
    """A transformers checkpoint folder: ``model.safetensors``, ``config.json`` carrying ``qconfig`` as its
    ``quantization_config`` (None: none), and the tokenizer: the loaded one, else the source folder's tokenizer files
    (GPTQModel loads a folder only with its tokenizer). Returns the names of the files written."""
    from ...files import save_safetensors

    save_safetensors(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    if qconfig is not None:
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
