"""BlockEmbedding: a token embedding held in ggml blocks, as a GGUF file holds ``token_embd``.

A lookup gathers the rows of the ids and decodes only those (ggml's dequantizer). Tied to an output head held
in ggml blocks, it holds nothing of its own and reads the head kernel's blocks, so the table is stored once, as llama.cpp
stores it when a file has no ``output.weight``; untied, it owns its blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import UnsupportedError
from .forms.ggml.kernel import dequantize_op, ggml_dequantize
from .forms.ggml.tensor import GGML_TYPES, GGMLBlockTensor
from .kernels.base import Kernel, traced


class BlockEmbedding(nn.Module):
    """``table[ids]`` for a table ``[vocab, dim]`` in a ggml block type, returned in ``dtype`` (times the model's
    ``embed_scale`` where it has one: Gemma's scaled embedding)."""

    def __init__(self, table: GGMLBlockTensor | None, dtype: torch.dtype, embed_scale: torch.Tensor | None = None,
                 head: Kernel | None = None) -> None:
        super().__init__()
        if (table is None) == (head is None):
            raise ValueError("a BlockEmbedding owns its table or reads a tied head's, not both")
        stored = table if table is not None else head.stored()  # type: ignore[union-attr]
        self.ggml_type, (self.num_embeddings, self.embedding_dim) = stored.ggml_type, stored.shape
        self.ggml_id = GGML_TYPES[stored.ggml_type].ggml_id
        self.dtype = dtype
        self.__dict__["head"] = head  # not a submodule: the head's module owns (and counts) the blocks
        self.register_buffer("blocks", None if table is None else table.blocks.contiguous())
        self.register_buffer("embed_scale", None if embed_scale is None else embed_scale.clone(), persistent=False)

    @property
    def tied(self) -> bool:
        return self.head is not None

    def stored(self) -> GGMLBlockTensor:
        if self.head is not None:
            return self.head.stored()
        return GGMLBlockTensor(self.blocks, self.ggml_type, (self.num_embeddings, self.embedding_dim))

    def analytic_weight_bytes(self) -> int:
        """The table's bytes where this module holds it (0 when tied: the head's kernel counts them)."""
        return 0 if self.tied else GGMLBlockTensor.analytic_nbytes(
            (self.num_embeddings, self.embedding_dim), self.ggml_type)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.stored().blocks[ids.reshape(-1)]
        out = traced(ggml_dequantize, dequantize_op)(rows, self.ggml_id, self.embedding_dim, 0, rows.shape[0],
                                                     self.dtype)
        out = out.reshape(*ids.shape, self.embedding_dim)
        return out if self.embed_scale is None else out * self.embed_scale.to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.ggml_type}" + (", tied to the head" if self.tied else "")


def block_embedding_(model: nn.Module, table: GGMLBlockTensor | None = None) -> BlockEmbedding | None:
    """Replace ``model``'s input embedding by a ``BlockEmbedding``: of ``table`` when given, else of its output
    head's blocks (a head quantized in a ggml type whose table the embedding shares). None (nothing changed)
    when neither applies."""
    old = model.get_input_embeddings()
    if table is None:
        new = tied_block_embedding(old, model.get_output_embeddings())
    else:
        new = None if getattr(old, "weight", None) is None else BlockEmbedding(table, old.weight.dtype, _scale(old))
    if new is not None:
        model.set_input_embeddings(new)
    return new


def tied_block_embedding(old: nn.Module, head: nn.Module | None) -> BlockEmbedding | None:
    """A lookup standing in for the embedding ``old`` that reads the blocks of ``head`` (an output head quantized
    in a ggml type, tied to ``old``), or None where the head holds no such blocks. Nothing is installed."""
    from .linear import QuantizedLinear

    weight = getattr(old, "weight", None)
    if weight is None or not (isinstance(head, QuantizedLinear) and _holds_blocks(head.kernel)):
        return None
    return BlockEmbedding(None, weight.dtype, _scale(old), head.kernel)


def _scale(embedding: nn.Module) -> torch.Tensor | None:
    """The embedding's ``embed_scale`` (Gemma's scaled embedding), where it has one."""
    scale = getattr(embedding, "embed_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def _holds_blocks(kernel: Kernel) -> bool:
    try:
        return isinstance(kernel.stored(), GGMLBlockTensor)
    except UnsupportedError:  # a kernel that cannot give its stored form back holds none a lookup reads
        return False
