"""A KV cache that really stores quantized keys and values: a transformers cache layer.

Each layer keeps the most recent ``residual_tokens`` positions in the model's dtype and moves
older ones, once, into stored chunks (never re-quantized): integer codes packed with per-group
scales and zero points along the head dimension (``token`` axis) or along blocks of
``group_size`` positions per channel (``channel`` axis, as KIVI does for keys), a plain cast to
a smaller float dtype, or a microscaling form per position and head (NVFP4, MXFP4, MXFP8). With
``rotate``, each head's vector is multiplied by a Walsh-Hadamard matrix in blocks of 64 before it is
stored and by it again when read (the matrix is orthonormal and symmetric, so it is its own inverse), as
llama.cpp rotates quantized K and V caches: an outlier channel is spread over its block before rounding.
Attention sees the dequantized history followed by the residual.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Literal, Protocol

import torch

from ..quant.forms.affine.tensor import QuantizedTensor, quantize_tensor
from ..quant.forms.microscaling import MXTensor, NVFP4Tensor, quantize_mx, quantize_nvfp4
from .ggml_rows import GGML_ELEMENTS, GGMLRows, quantize_rows, rows_nbytes
from .hf_compat import DynamicLayer, DynamicSlidingWindowLayer, advance_window, initialize_layer, window_position

Axis = Literal["token", "channel"]
FP16_TINY = torch.finfo(torch.float16).tiny
E4M3_MAX = 448.0
ROTATION_BLOCK = 64  # llama.cpp rotates heads whose size is a multiple of 64, in blocks of 64
# a head's element form: (kind, block); the ggml ones are llama.cpp's cache types (``ggml.py``)
ELEMENTS = {"nvfp4": ("e2m1", 16), "mxfp4": ("e2m1", 32), "mxfp8": ("e4m3", 32), "q8_0": ("q8_0", 32),
            "q4_0": ("q4_0", 32)}


@functools.cache
def _hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of size ``n`` (a power of two): symmetric, its own inverse."""
    with torch.inference_mode(False):  # cached: never an inference tensor, whichever mode first asks for it
        return _sylvester(n)


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def hadamard_rotate(x: torch.Tensor, block: int | None = ROTATION_BLOCK) -> torch.Tensor:
    """``x [..., d]`` (``d`` a multiple of 64) times the block-diagonal Walsh-Hadamard matrix of blocks of
    ``block`` (None: the largest power of two dividing ``d``, as llama.cpp rotates keys; it rotates values in
    blocks of 64), in float32; applied twice it gives ``x`` back."""
    d = x.shape[-1]
    block = block or d & -d
    h = _hadamard(block).to(x.device)
    return (x.float().reshape(*x.shape[:-1], d // block, block) @ h).reshape(x.shape)


def encode_element(x: torch.Tensor, element: str) -> MXTensor | NVFP4Tensor | GGMLRows:
    """``x [rows, d]`` in an element form per row: NVFP4 with its global scale fixed at 1 (single-level, the
    e4m3 block scales alone: a cache has no tensor-wide maximum to take one from as positions arrive), MX, or
    ggml's q8_0 / q4_0 blocks."""
    if element in GGML_ELEMENTS:
        return quantize_rows(x, element)
    if element == "nvfp4":
        return quantize_nvfp4(x.float(), global_scale=torch.ones(1, device=x.device))
    return quantize_mx(x.float(), ELEMENTS[element][0])


def element_nbytes(rows: int, d: int, element: str) -> int:
    """Bytes of ``rows`` heads of ``d`` stored in ``element`` (codes and block scales; NVFP4's fixed global scale
    is not stored)."""
    if element in GGML_ELEMENTS:
        return rows_nbytes(rows, d, element)
    kind, block = ELEMENTS[element]
    return rows * (d * (4 if kind == "e2m1" else 8) // 8 + d // block)


class Chunk(Protocol):
    @property
    def tokens(self) -> int: ...

    def drop_first(self, n: int) -> "Chunk | None": ...

    def merged(self, other: "Chunk") -> "Chunk | None": ...

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...


@dataclass
class IntChunk:
    """``[B, H, t, D]`` states as packed integer codes."""

    q: QuantizedTensor
    shape: tuple[int, int, int, int]
    axis: Axis

    @property
    def tokens(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        return self.q.nbytes

    def merged(self, other: "Chunk") -> "IntChunk | None":
        """One chunk holding this one's positions then ``other``'s (token axis: rows just concatenate)."""
        if not isinstance(other, IntChunk) or self.axis != "token" or other.axis != "token":
            return None
        b, h, t1, d = self.shape
        t2 = other.shape[2]

        def cat(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
            if x is None or y is None:
                return None
            return torch.cat([x.reshape(b, h, t1, -1), y.reshape(b, h, t2, -1)], dim=2).reshape(b * h * (t1 + t2), -1)

        q, r = self.q, other.q
        joined = dataclasses.replace(q, packed=cat(q.packed, r.packed), scales=cat(q.scales, r.scales),
                                     zeros=cat(q.zeros, r.zeros), shape=(b * h * (t1 + t2), d))  # keeps q's class
        return IntChunk(joined, (b, h, t1 + t2, d), self.axis)

    def drop_first(self, n: int) -> "IntChunk | None":
        """This chunk without its first ``n`` positions (token axis: rows are independent), or None."""
        if self.axis != "token":
            return None
        b, h, t, d = self.shape
        q = self.q

        def rows(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.reshape(b, h, t, -1)[:, :, n:].reshape(b * h * (t - n), -1).contiguous()

        kept = dataclasses.replace(q, packed=rows(q.packed), scales=rows(q.scales), zeros=rows(q.zeros),
                                   shape=(b * h * (t - n), d))
        return IntChunk(kept, (b, h, t - n, d), self.axis)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        b, h, t, d = self.shape
        x = self.q.dequantize(dtype)
        return x.reshape(b, h, t, d) if self.axis == "token" else x.reshape(b, h, d, t).transpose(-1, -2)


def head_scales(scales: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """Static per-head scales as a ``[1, H, 1, 1]`` float32 tensor, broadcast over batch, positions and channels."""
    return torch.tensor(scales, dtype=torch.float32, device=device).view(1, -1, 1, 1)


def encode_head_scaled(x: torch.Tensor, scales: tuple[float, ...]) -> torch.Tensor:
    """``x [B, H, t, D]`` as float8 e4m3 codes under one static scale per head, as vLLM stores an fp8 cache with
    calibrated scales: ``x / scale`` saturated to ±448 (a value past the calibrated maximum clamps, never inf)."""
    return (x.float() / head_scales(scales, x.device)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@dataclass
class CastChunk:
    """``[B, H, t, D]`` states cast to a smaller float dtype (fp8 with one scale per position and head, or with
    static per-head scales ``head_scale`` that the format holds, not the chunk)."""

    data: torch.Tensor
    scale: torch.Tensor | None
    head_scale: tuple[float, ...] | None = None

    @property
    def tokens(self) -> int:
        return self.data.shape[2]

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return self.data.numel() * self.data.element_size() + extra

    def merged(self, other: "Chunk") -> "CastChunk | None":
        if not isinstance(other, CastChunk) or other.head_scale != self.head_scale:
            return None
        scale = None if self.scale is None else torch.cat([self.scale, other.scale], dim=2)
        return CastChunk(torch.cat([self.data, other.data], dim=2), scale, self.head_scale)

    def drop_first(self, n: int) -> "CastChunk":
        scale = None if self.scale is None else self.scale[:, :, n:].contiguous()
        return CastChunk(self.data[:, :, n:].contiguous(), scale, self.head_scale)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        if self.head_scale is not None:
            return (self.data.float() * head_scales(self.head_scale, self.data.device)).to(dtype)
        x = self.data.to(dtype)
        return x if self.scale is None else x * self.scale.to(dtype)


@dataclass
class ElementChunk:
    """``[B, H, t, D]`` states in an element form (microscaling, ggml blocks), one row per position and head."""

    q: MXTensor | NVFP4Tensor | GGMLRows
    shape: tuple[int, int, int, int]

    @property
    def tokens(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        return self.q.codes.numel() * self.q.codes.element_size() + self.q.scales.numel() * self.q.scales.element_size()

    def _rows(self, pick: Callable[[torch.Tensor], torch.Tensor], t: int) -> "ElementChunk":
        b, h, _, d = self.shape
        q = dataclasses.replace(self.q, codes=pick(self.q.codes), scales=pick(self.q.scales), shape=(b * h * t, d))
        return ElementChunk(q, (b, h, t, d))

    def merged(self, other: "Chunk") -> "ElementChunk | None":
        if not isinstance(other, ElementChunk) or type(other.q) is not type(self.q):
            return None
        b, h, t1, d = self.shape
        t2 = other.shape[2]

        def cat(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cat([x.reshape(b, h, t1, -1), y.reshape(b, h, t2, -1)], dim=2).reshape(b * h * (t1 + t2), -1)

        q = dataclasses.replace(self.q, codes=cat(self.q.codes, other.q.codes), scales=cat(self.q.scales, other.q.scales),
                                shape=(b * h * (t1 + t2), d))
        return ElementChunk(q, (b, h, t1 + t2, d))

    def drop_first(self, n: int) -> "ElementChunk":
        b, h, t, d = self.shape
        return self._rows(lambda x: x.reshape(b, h, t, -1)[:, :, n:].reshape(b * h * (t - n), -1).contiguous(), t - n)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.q.dequantize(torch.float32).reshape(self.shape).to(dtype)


@dataclass
class RotatedChunk:
    """A chunk stored from Hadamard-rotated states: read back, rotated again (the rotation is its own inverse)."""

    inner: Chunk
    block: int | None = ROTATION_BLOCK  # the rotation's block (``hadamard_rotate``)

    @property
    def tokens(self) -> int:
        return self.inner.tokens

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def merged(self, other: "Chunk") -> "RotatedChunk | None":
        joined = self.inner.merged(other.inner) if isinstance(other, RotatedChunk) and other.block == self.block else None
        return None if joined is None else RotatedChunk(joined, self.block)

    def drop_first(self, n: int) -> "RotatedChunk | None":
        kept = self.inner.drop_first(n)
        return None if kept is None else RotatedChunk(kept, self.block)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return hadamard_rotate(self.inner.dequantize(torch.float32), self.block).to(dtype)


@dataclass(frozen=True)
class Codec:
    """How positions leaving the residual window are stored."""

    bits: int | None = None  # None: a float cast to ``dtype`` (or, with ``element``, a microscaling form)
    axis: Axis = "token"
    group_size: int = 64
    dtype: torch.dtype | None = None
    element: str | None = None  # nvfp4 | mxfp4 | mxfp8: one row per position and head in that form
    rotate: bool = False  # a Walsh-Hadamard rotation of each head before storing, undone on read
    rotate_block: int | None = ROTATION_BLOCK  # its blocks; None: the largest power of two dividing the head (keys)
    head_scale: tuple[float, ...] | None = None  # fp8: one calibrated scale per KV head, none stored per position

    def rotation(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as it is rotated before being stored (itself when the codec does not rotate)."""
        return hadamard_rotate(x, self.rotate_block) if self.rotate else x

    @property
    def block(self) -> int:
        """Positions moved together: a channel-axis group spans ``group_size`` positions."""
        return self.group_size if self.bits is not None and self.axis == "channel" else 1

    def encode(self, x: torch.Tensor) -> Chunk:
        if self.rotate:
            inner = dataclasses.replace(self, rotate=False).encode(hadamard_rotate(x, self.rotate_block))
            return RotatedChunk(inner, self.rotate_block)
        b, h, t, d = x.shape
        if self.element is not None:
            return ElementChunk(encode_element(x.reshape(b * h * t, d), self.element), (b, h, t, d))
        if self.bits is None:
            if self.dtype == torch.float8_e4m3fn and self.head_scale is not None:
                return CastChunk(encode_head_scaled(x, self.head_scale), None, self.head_scale)
            if self.dtype == torch.float8_e4m3fn:
                # at least float16's smallest normal: a zero (a padding token's keys) or tiny row stays finite
                scale = (x.abs().amax(-1, keepdim=True).float() / 448.0).clamp(min=FP16_TINY).to(torch.float16)
                return CastChunk((x.float() / scale.float()).to(self.dtype), scale)
            return CastChunk(x.to(self.dtype), None)
        if self.axis == "token":  # groups along the head dimension, one row per position and head
            rows = x.reshape(b * h * t, d)
            group = None if self.group_size >= d else self.group_size
        else:  # one row per channel and head, over this block of positions
            rows = x.transpose(-1, -2).reshape(b * h * d, t)
            group = None
        return IntChunk(quantize_tensor(rows.float(), self.bits, group), (b, h, t, d), self.axis)

    def nbytes(self, b: int, h: int, t: int, d: int) -> int:
        """Bytes of ``t`` stored positions, from the format alone (matches ``encode``)."""
        if t == 0:
            return 0
        if self.element is not None:
            return element_nbytes(b * h * t, d, self.element)
        if self.bits is None:
            size = self.dtype.itemsize
            per_position = self.dtype == torch.float8_e4m3fn and self.head_scale is None
            return b * h * t * d * size + (b * h * t * 2 if per_position else 0)
        if self.axis == "channel":  # stored one block of group_size positions at a time
            return (t // self.block) * QuantizedTensor.analytic_nbytes((b * h * d, self.block), self.bits, None, False, 2)
        group = None if self.group_size >= d else self.group_size
        return QuantizedTensor.analytic_nbytes((b * h * t, d), self.bits, group, False, 2)


def _append(chunks: list[Chunk], chunk: Chunk) -> None:
    """Add ``chunk`` after the others, joined to the last one where the layout allows (same bytes, fewer pieces)."""
    joined = chunks[-1].merged(chunk) if chunks else None
    if joined is not None:
        chunks[-1] = joined
    else:
        chunks.append(chunk)


class PackedKVLayer(DynamicLayer):
    """A cache layer: stored chunks (quantized once) + a full-precision residual of recent positions."""

    def __init__(self, key_codec: Codec, value_codec: Codec, residual_tokens: int) -> None:
        super().__init__()
        self.key_codec, self.value_codec, self.residual_tokens = key_codec, value_codec, residual_tokens
        self.block = max(key_codec.block, value_codec.block)
        self.key_chunks: list[Chunk] = []
        self.value_chunks: list[Chunk] = []
        self.stored_tokens = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            initialize_layer(self, key_states, value_states)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        overflow = self.keys.shape[-2] - self.residual_tokens
        move = overflow // self.block * self.block if overflow > 0 else 0
        for start in range(0, move, self.block if self.block > 1 else max(move, 1)):
            end = start + (self.block if self.block > 1 else move)
            _append(self.key_chunks, self.key_codec.encode(self.keys[:, :, start:end]))
            _append(self.value_chunks, self.value_codec.encode(self.values[:, :, start:end]))
        if move:
            self.keys, self.values = self.keys[:, :, move:].contiguous(), self.values[:, :, move:].contiguous()
            self.stored_tokens += move
        dtype = key_states.dtype
        keys = torch.cat([*(c.dequantize(dtype) for c in self.key_chunks), self.keys], dim=-2)
        values = torch.cat([*(c.dequantize(dtype) for c in self.value_chunks), self.values], dim=-2)
        return keys, values

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return self.stored_tokens + (self.keys.shape[-2] if self.keys.dim() == 4 else 0)

    @property
    def nbytes(self) -> int:
        residual = sum(t.numel() * t.element_size() for t in (self.keys, self.values) if isinstance(t, torch.Tensor))
        return residual + sum(c.nbytes for c in (*self.key_chunks, *self.value_chunks))

    def reset(self) -> None:
        self.key_chunks, self.value_chunks, self.stored_tokens = [], [], 0
        super().reset()

    def drop_before(self, cutoff: int) -> None:
        """Forget positions before ``cutoff`` (absolute): whole chunks, the head of a chunk that can be cut
        (token-axis and cast chunks; a per-channel block stays whole), and the head of the residual."""
        for chunks in (self.key_chunks, self.value_chunks):
            start = self.stored_tokens - sum(c.tokens for c in chunks)
            while chunks and start < cutoff:
                chunk, n = chunks[0], min(cutoff - start, chunks[0].tokens)
                kept = None if n == chunk.tokens else chunk.drop_first(n)
                if n == chunk.tokens:
                    chunks.pop(0)
                elif kept is not None:
                    chunks[0] = kept
                else:
                    break
                start += n
        cut = cutoff - self.stored_tokens
        if cut > 0 and self.keys.dim() == 4:
            self.keys, self.values = self.keys[:, :, cut:].contiguous(), self.values[:, :, cut:].contiguous()
            self.stored_tokens += cut  # those residual positions are gone; count them as passed through

    def residual_after(self, tokens: int) -> int:
        """Positions left in the residual after ``tokens`` positions went through this layer."""
        if tokens <= self.residual_tokens:
            return tokens
        return self.residual_tokens + (tokens - self.residual_tokens) % self.block



class PackedSlidingKVLayer(DynamicSlidingWindowLayer):
    """A sliding-window layer over a ``PackedKVLayer``: attention sees the last ``sliding_window - 1``
    positions plus the new ones, and only those are kept (a per-channel block that straddles the edge
    stays whole)."""

    def __init__(self, sliding_window: int, key_codec: Codec, value_codec: Codec, residual_tokens: int) -> None:
        super().__init__(sliding_window)
        self.inner = PackedKVLayer(key_codec, value_codec, residual_tokens)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            initialize_layer(self, key_states, value_states)
        before = advance_window(self, key_states.shape[-2])
        keys, values = self.inner.update(key_states, value_states)
        visible = min(before, self.sliding_window - 1) + key_states.shape[-2]
        self.inner.drop_before(window_position(self) - (self.sliding_window - 1))
        return keys[:, :, -visible:], values[:, :, -visible:]

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def reset(self) -> None:
        self.inner.reset()
        super().reset()
