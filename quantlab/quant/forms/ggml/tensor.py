"""ggml's block types (what a GGUF file stores for llama.cpp) as a stored weight form.

Each output row is a run of blocks along the input: the legacy blocks of 32 weights (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, IQ4_NL) and the k-quant super-blocks of 256 (Q2_K … Q6_K, IQ4_XS: sub-block scales and mins packed in 4,
6 or 8 bits under float16 super-block scales). Quantization is ggml's own code (``kernel.py``,
``quantize_ggml``, over ``native/src/ggml.c`` over ggml's vendored code), so a tensor gives the bytes llama.cpp's quantizer
writes, with or without an importance matrix (per-input-column weights of the rounding error, ``imatrix``).

A row whose length is not a whole number of its type's blocks takes llama.cpp's substitute for that type (its
quantizer's rule: Q2_K and Q3_K → Q4_0, IQ4_XS → IQ4_NL, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0; F16 where even those
do not divide the row), so the type a tensor holds is the one llama.cpp would have written for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ....errors import UnsupportedError
from ...tensors.base import Spec, WeightTensor


class BlockType(NamedTuple):
    """A ggml block type: its number in ggml's ``enum ggml_type``, weights per block, bytes per block."""

    ggml_id: int
    block: int
    block_bytes: int
    description: str


GGML_TYPES: dict[str, BlockType] = {
    "Q4_0": BlockType(2, 32, 18, "4-bit codes, one float16 scale per 32"),
    "Q4_1": BlockType(3, 32, 20, "4-bit codes, float16 scale and min per 32"),
    "Q5_0": BlockType(6, 32, 22, "5-bit codes, one float16 scale per 32"),
    "Q5_1": BlockType(7, 32, 24, "5-bit codes, float16 scale and min per 32"),
    "Q8_0": BlockType(8, 32, 34, "8-bit codes, one float16 scale per 32"),
    "Q2_K": BlockType(10, 256, 84, "2-bit codes, 4-bit scales and mins per 16, float16 super-scales per 256"),
    "Q3_K": BlockType(11, 256, 110, "3-bit codes, 6-bit scales per 16, a float16 super-scale per 256"),
    "Q4_K": BlockType(12, 256, 144, "4-bit codes, 6-bit scales and mins per 32, float16 super-scales per 256"),
    "Q5_K": BlockType(13, 256, 176, "5-bit codes, 6-bit scales and mins per 32, float16 super-scales per 256"),
    "Q6_K": BlockType(14, 256, 210, "6-bit codes, 8-bit scales per 16, a float16 super-scale per 256"),
    "IQ4_NL": BlockType(20, 32, 18, "4-bit indices into a 16-value non-linear table, a float16 scale per 32"),
    "IQ4_XS": BlockType(23, 256, 136, "IQ4_NL's table, 6-bit scales per 32, a float16 super-scale per 256"),
    "F16": BlockType(1, 1, 2, "float16 weights (what llama.cpp writes where no block type divides a row)"),
}
# llama.cpp's quantizer: the type written instead where a row is not whole blocks of the asked one
SUBSTITUTES = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
FLOAT_SUBSTITUTE = "F16"  # where no block type divides the row


def row_type(ggml_type: str, n_in: int) -> str:
    """The type llama.cpp writes for a row of ``n_in`` weights asked in ``ggml_type``: itself, its substitute, or
    F16 (a row that is not whole blocks of either)."""
    if n_in % GGML_TYPES[ggml_type].block == 0:
        return ggml_type
    sub = SUBSTITUTES.get(ggml_type)
    return sub if sub is not None and n_in % GGML_TYPES[sub].block == 0 else FLOAT_SUBSTITUTE


def row_bytes(ggml_type: str, n_in: int) -> int:
    """Bytes of one row of ``n_in`` weights in ``ggml_type`` (whole blocks)."""
    t = GGML_TYPES[ggml_type]
    if n_in % t.block:
        raise UnsupportedError(f"{ggml_type} holds rows of whole blocks of {t.block}; {n_in} weights are not")
    return n_in // t.block * t.block_bytes


@dataclass
class GGMLBlockTensor(WeightTensor):
    """A weight ``[out, in]`` in one ggml block type: ``blocks`` uint8 ``[out, in / block · block bytes]``, laid out
    as ggml's ``block_<type>`` structs one after another along each row (a GGUF tensor's bytes)."""

    blocks: torch.Tensor
    ggml_type: str
    shape: tuple[int, int]

    form = "ggml"

    def spec(self) -> Spec:
        return Spec(self.form, {"ggml_type": self.ggml_type})

    def describe(self) -> str:
        return f"ggml {self.ggml_type}"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("blocks",)

    @property
    def bits(self) -> float:
        t = GGML_TYPES[self.ggml_type]
        return 8 * t.block_bytes / t.block

    @staticmethod
    def analytic_nbytes(shape: tuple[int, int], ggml_type: str) -> int:
        return shape[0] * row_bytes(ggml_type, shape[1])

    def layout_nbytes(self) -> int:
        return self.analytic_nbytes(self.shape, self.ggml_type)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        """gguf-py's decoder (numpy; ``kernel.py`` decodes with ggml's C, to the same numbers)."""
        rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
        blocks = self.blocks[rows]
        if self.ggml_type == FLOAT_SUBSTITUTE:
            return blocks.contiguous().view(torch.float16).to(dtype)
        import gguf

        kind = getattr(gguf.GGMLQuantizationType, self.ggml_type)
        values = gguf.quants.dequantize(blocks.cpu().contiguous().numpy(), kind)
        return torch.from_numpy(values.astype("float32", copy=False)).reshape(blocks.shape[0], self.shape[1]).to(
            device=self.blocks.device, dtype=dtype)


