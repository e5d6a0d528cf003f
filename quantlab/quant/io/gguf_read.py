"""A GGUF file's tensors as the model's: each linear's ggml blocks as they are, other tensors dequantized.

What a downloaded GGUF (a llama.cpp k-quant, a legacy Q4_1 ...) holds is measured as that file: every linear
whose tensor is in one of ``GGML_TYPES`` keeps the file's blocks byte for byte (``GGMLBlockTensor``), so its bytes,
kernel and numbers are the file's, not transformers' dequantized bf16. The inverse of the exporter's
conventions (``io/gguf.py``) maps it back: gguf-py's tensor names, the llama-family Q/K row order, Gemma's
``1 + weight`` norms. A tied output head the file does not hold is llama.cpp's: the token embedding's blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from ...errors import UnsupportedError
from ..forms.ggml.tensor import FLOAT_SUBSTITUTE, GGML_TYPES, GGMLBlockTensor, row_bytes
from .gguf import NORM_PLUS_ONE, PERMUTES_QK, architecture, qk_rows, tensor_name_map

DENSE_TYPES = ("F32", "F16", "BF16")
BLOCK_TYPES = frozenset(GGML_TYPES) - {FLOAT_SUBSTITUTE}  # what a linear keeps as blocks (else: dense values)
TIED_HEAD_SOURCE = "token_embd.weight"


@dataclass
class GGUFTensors:
    """The tensors of one GGUF file (``gguf.GGUFReader``'s), by name, with the file's architecture."""

    path: Path
    arch: str
    layers: int
    tensors: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> "GGUFTensors":
        import gguf

        try:
            reader = gguf.GGUFReader(str(path))
        except (ValueError, OSError) as e:
            raise UnsupportedError(f"{path}: not a readable GGUF file ({e})") from None
        arch = reader.fields["general.architecture"].contents()
        count = reader.fields.get(f"{arch}.block_count")
        return cls(path, arch, int(count.contents()) if count is not None else 0, {t.name: t for t in reader.tensors})

    def type_of(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def names_for(self, module_names: list[str]) -> dict[str, str]:
        """Each module's GGUF tensor stem (``model.layers.0.mlp.down_proj`` → ``blk.0.ffn_down``) in this file's
        architecture, where gguf-py names it."""
        names = tensor_name_map(self.arch, SimpleNamespace(num_hidden_layers=self.layers))
        return {m: stem for m in module_names if (stem := names.get_name(m)) is not None}

    def tensor_for(self, module: str, stem: str | None, is_head: bool) -> str:
        """The name of the tensor holding ``module``'s weight (``stem``: its GGUF name); a head the file does not
        hold is llama.cpp's output: the token embedding."""
        key = f"{stem}.weight"
        if key not in self.tensors and is_head and TIED_HEAD_SOURCE in self.tensors:
            key = TIED_HEAD_SOURCE
        if key not in self.tensors:
            raise UnsupportedError(f"{self.path}: no tensor for {module} (looked for {key})")
        return key

    def linear_types(self, linears: dict[str, tuple[int, int]], head: str | None) -> dict[str, str]:
        """The ggml type each linear is stored in (a tied head without a tensor of its own: the embedding's)."""
        stems = self.names_for(list(linears))
        return {m: self.type_of(self.tensor_for(m, stems.get(m), m == head)) for m in linears}

    def blocks(self, name: str, shape: tuple[int, int], module: str, config: Any) -> GGMLBlockTensor:
        """The tensor ``name`` as ggml blocks ``[out, row bytes]`` in the model's row order, for a weight ``shape``."""
        t = self.tensors[name]
        kind = t.tensor_type.name
        if kind not in BLOCK_TYPES:
            raise UnsupportedError(f"{self.path}: {name} is {kind}; readable block types: "
                                   f"{', '.join(sorted(BLOCK_TYPES))} (or F32/F16/BF16)")
        data = np.asarray(t.data)
        if data.shape != (shape[0], row_bytes(kind, shape[1])):
            raise UnsupportedError(f"{self.path}: {name} holds {data.shape[0]} rows of {data.shape[-1]} bytes; the "
                                   f"model's {module} is {list(shape)} ({kind}: rows of {row_bytes(kind, shape[1])})")
        blocks = torch.from_numpy(data.copy())
        return GGMLBlockTensor(self._model_rows(blocks, module, config), kind, shape)

    def dense(self, name: str, module: str, config: Any) -> torch.Tensor:
        """The tensor ``name`` in float32, in the model's shape, row order and norm convention."""
        import gguf

        t = self.tensors[name]
        kind = t.tensor_type
        values = np.asarray(t.data)
        if kind.name == "BF16":
            values = torch.from_numpy(values.copy()).view(torch.bfloat16).float().numpy()
        elif kind.name not in DENSE_TYPES:
            values = gguf.quants.dequantize(values, kind)
        out = torch.from_numpy(np.array(values, dtype=np.float32))
        out = out.reshape([int(n) for n in reversed(t.shape)])
        if self.arch in NORM_PLUS_ONE and name.endswith("norm.weight"):
            out = out - 1.0
        return self._model_rows(out, module, config)

    def _model_rows(self, t: torch.Tensor, module: str, config: Any) -> torch.Tensor:
        if self.arch not in PERMUTES_QK or (rows := qk_rows(module, config, t.shape[0])) is None:
            return t
        return t[torch.argsort(rows)]  # the exporter wrote rows[i] at i


def check_architecture(found: GGUFTensors, model: nn.Module) -> None:
    """Refuse a file of another architecture or depth than the recipe's model."""
    arch = architecture(model.config, None)
    if found.arch != arch or found.layers != model.config.num_hidden_layers:
        raise UnsupportedError(f"{found.path}: a {found.arch} model of {found.layers} layers; the recipe's model is "
                               f"{arch} with {model.config.num_hidden_layers}")
