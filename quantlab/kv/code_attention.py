"""Decode attention read from a static quantized cache's stored codes (``native/kv_attention.c``).

A global static layer (``static.StaticPackedLayer``) keeps the oldest positions as codes in its stores and the
recent ones in a full-precision ring. For a decode row, ``attend`` computes the scores over the stored rows and
the weighted sum of the stored values in C, each row decoded once into scratch (the stored bytes are what a step
reads, as llama.cpp's quantized cache is read), and only the stored positions up to the layer's length: no
dequantized history is built. Where the ring is held in a float dtype and the stores are plain (not rotated, no
static per-head scales), the ring's rows are read in the same call (``kv_scores_ring``, ``kv_values_ring``): one
row of scores over the stored slots and the ring, one softmax, one weighted sum, as a cache held whole is read.
Otherwise the ring's few positions go through their own products and the softmax is taken part by part. The C
functions are registered torch ops with fake implementations, so the path runs inside the compiled step.

Layouts read: packed integers per position (token axis, any width 2-8, groups along the head dimension), keys
per channel (KIVI: one scale and zero point per channel over a block of positions), float casts (float32,
float16, bfloat16, float8 e4m3 with its per-position scale, or with static per-head scales applied to each head's
scores and weighted values) and the block forms of ``packed.ELEMENTS`` (NVFP4,
MXFP4, MXFP8, llama.cpp's q8_0 and q4_0). A Hadamard-rotated store (``rotate: hadamard``) is read as stored: the
query is rotated as the keys were (q . k = Hq . Hk, the matrix orthonormal) and the weighted sum of the rotated
values is rotated back (the matrix is its own inverse), so a rotated cache costs two small products a step.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Protocol

import torch

from .. import native
from ..errors import UnsupportedError
from ..native.ops import native_op, register_fake
from .packed import ELEMENTS


class CodeStore(Protocol):
    """What the kernel reads of a layer's store (``static.CodeStore`` is one): its codec and its tensors."""

    codec: Any
    shape: tuple[int, ...]

INT, CAST_F32, CAST_F16, CAST_BF16, CAST_E4M3, INT_CHANNEL = range(6)
CASTS = {torch.float32: CAST_F32, torch.float16: CAST_F16, torch.bfloat16: CAST_BF16}
BLOCK_KINDS = {"nvfp4": 6, "mxfp4": 7, "mxfp8": 8, "q8_0": 9, "q4_0": 10}  # packed.ELEMENTS' forms
MAX_HEAD_DIM = 512  # the kernel's scratch row
MAX_CHANNEL_BLOCK = 1024  # positions of a per-channel key block (its scores are kept on the stack)


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The built ``kv_attention`` library (``flags``: extra compiler options, ``native.load``)."""
    lib = native.load("kv_attention", flags)
    i, p = ctypes.c_int, ctypes.c_void_p
    for f in (lib.kv_scores, lib.kv_values):
        f.argtypes = [i, i, i, i, i, i, p, p, p, i, i, p, p, i, i, p, i, p]
        f.restype = None
    return lib


@torch.compiler.assume_constant_result
@functools.cache
def available() -> bool:
    """Whether the C kernel builds on this machine (a C compiler is found); otherwise layers keep the expression."""
    global _BUILT
    try:
        library()
    except UnsupportedError:
        return False
    native.load_ops("kv_attention")  # the C++ kernels of its ops, where they build
    _BUILT = True
    return True


_BUILT = False  # set by available(): what a compiled graph reads (tracing available() would trace the build)


def _kind(codec_bits: int | None, dtype: torch.dtype | None) -> int | None:
    if codec_bits is not None:
        return INT
    if dtype == getattr(torch, "float8_e4m3fn", None):
        return CAST_E4M3
    return CASTS.get(dtype)  # type: ignore[arg-type]


def reads_codes(store: CodeStore | None) -> bool:
    """Whether the kernel reads ``store``'s layout: integers per position or per channel (keys), or a float cast."""
    if not available():
        return False
    if store is None:
        return True
    codec = store.codec
    if codec.bits is not None and codec.axis == "channel":
        return codec.block <= MAX_CHANNEL_BLOCK  # rotated or not: the query is rotated as the keys were
    if codec.element is not None:
        return codec.element in BLOCK_KINDS and store.shape[2] <= MAX_HEAD_DIM
    return _kind(codec.bits, codec.dtype) is not None and store.shape[2] <= MAX_HEAD_DIM


def _heads_and_slots(kind: int, group: int, d: int, data: torch.Tensor) -> tuple[int, int]:
    """(batch x heads, slots) of a store's main tensor: ``[b, h, slots, ·]``, per channel ``[blocks, b·h·d, ·]``."""
    if kind == INT_CHANNEL:
        return data.shape[1] // d, data.shape[0] * group
    return data.shape[0] * data.shape[1], data.shape[2]


def _ring_slots(ring: torch.Tensor | None) -> int:
    return 0 if ring is None else ring.shape[2]


def _call(name: str, kind: int, bits: int, group: int, data: torch.Tensor, scales: torch.Tensor | None,
          zeros: torch.Tensor | None, n_valid: torch.Tensor, x: torch.Tensor, d: int, ring: torch.Tensor | None,
          out: torch.Tensor) -> None:
    bh, s = _heads_and_slots(kind, group, d, data)
    row_bytes = data.shape[-1] * data.element_size()
    zero_bytes = zeros.shape[-1] if zeros is not None else 0
    ring = None if ring is None else ring.contiguous()
    getattr(library(), name)(kind, bits, d, group, row_bytes, zero_bytes, data.data_ptr(),
                              None if scales is None else scales.data_ptr(), None if zeros is None else zeros.data_ptr(),
                              bh, s, n_valid.data_ptr(), x.data_ptr(), x.shape[1], 0 if ring is None else CASTS[ring.dtype],
                              None if ring is None else ring.data_ptr(), _ring_slots(ring), out.data_ptr())


def kv_scores(kind: int, bits: int, group: int, d: int, data: torch.Tensor, scales: torch.Tensor | None,
              zeros: torch.Tensor | None, n_valid: torch.Tensor, q: torch.Tensor,
              ring: torch.Tensor | None = None) -> torch.Tensor:
    """``q [BH, G, d]`` float32 against stored key rows: ``[BH, G, S]`` (0 from slot ``n_valid``). With ``ring``
    (a layer's recent keys in a float dtype, ``[b, h, R, d]``, ``b x h = BH``): ``[BH, G, S + R]``, the ring's
    scores after the stored slots."""
    q = q.contiguous()
    slots = _heads_and_slots(kind, group, d, data)[1] + _ring_slots(ring)
    out = torch.empty(q.shape[0], q.shape[1], slots, dtype=torch.float32)
    _call("kv_scores", kind, bits, group, data, scales, zeros, n_valid.to(torch.int64), q, d, ring, out)
    return out


def kv_values(kind: int, bits: int, group: int, d: int, data: torch.Tensor, scales: torch.Tensor | None,
              zeros: torch.Tensor | None, n_valid: torch.Tensor, p: torch.Tensor,
              ring: torch.Tensor | None = None) -> torch.Tensor:
    """Weights ``p [BH, G, S]`` float32 over stored value rows: ``[BH, G, d]`` (slots below ``n_valid``). With
    ``ring`` (``[b, h, R, d]``): ``p [BH, G, S + R]``, the ring's weighted rows added after the stored ones."""
    p = p.contiguous()
    out = torch.empty(p.shape[0], p.shape[1], d, dtype=torch.float32)
    _call("kv_values", kind, bits, group, data, scales, zeros, n_valid.to(torch.int64), p, d, ring, out)
    return out


# The ops. Those with a ring are ops of their own (not an optional argument of the first two): a compiled graph
# kept in inductor's cache calls an op with the arguments of the schema it was compiled against.
def _scores(kind: int, bits: int, group: int, d: int, data: torch.Tensor, scales: torch.Tensor | None,
            zeros: torch.Tensor | None, n_valid: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kv_scores(kind, bits, group, d, data, scales, zeros, n_valid, q)


def _values(kind: int, bits: int, group: int, d: int, data: torch.Tensor, scales: torch.Tensor | None,
            zeros: torch.Tensor | None, n_valid: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return kv_values(kind, bits, group, d, data, scales, zeros, n_valid, p)


def _ring_scores(kind: int, bits: int, group: int, d: int, data: torch.Tensor, scales: torch.Tensor | None,
                 zeros: torch.Tensor | None, n_valid: torch.Tensor, q: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    return kv_scores(kind, bits, group, d, data, scales, zeros, n_valid, q, ring)


def _ring_values(kind: int, bits: int, group: int, d: int, data: torch.Tensor, scales: torch.Tensor | None,
                 zeros: torch.Tensor | None, n_valid: torch.Tensor, p: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    return kv_values(kind, bits, group, d, data, scales, zeros, n_valid, p, ring)


scores_op = native_op("kv_scores", _scores)
values_op = native_op("kv_values", _values)
ring_scores_op = native_op("kv_scores_ring", _ring_scores)
ring_values_op = native_op("kv_values_ring", _ring_values)


@register_fake(ring_scores_op)
@register_fake(scores_op)
def _(kind, bits, group, d, data, scales, zeros, n_valid, q, ring=None):
    slots = _heads_and_slots(kind, group, d, data)[1] + _ring_slots(ring)
    return q.new_empty(q.shape[0], q.shape[1], slots, dtype=torch.float32)


@register_fake(ring_values_op)
@register_fake(values_op)
def _(kind, bits, group, d, data, scales, zeros, n_valid, p, ring=None):
    return p.new_empty(p.shape[0], p.shape[1], d, dtype=torch.float32)


def _store_args(store: CodeStore) -> tuple[int, int, int, int, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    codec, t, d = store.codec, store.tensors, store.shape[2]
    if codec.element is not None:
        return BLOCK_KINDS[codec.element], 0, ELEMENTS[codec.element][1], d, t["codes"], t["scales"], None
    if codec.bits is not None and codec.axis == "channel":
        return INT_CHANNEL, codec.bits, codec.block, d, t["packed"], t["scales"], t["zeros"]
    kind = _kind(codec.bits, codec.dtype)
    assert kind is not None
    if kind == INT:
        return kind, codec.bits, store._group() or d, d, t["packed"], t["scales"], t["zeros"]  # type: ignore[return-value]
    return kind, 0, d, d, t["data"], t.get("scale"), None


def reads_dense(key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the kernel reads keys and values held as floats (``[b, hkv, t, d]``, contiguous on CPU: a native
    cache) for a decode row, through its casts: torch's bfloat16 batched matmuls cost about 30 us a call whatever
    their size (2 cores), the kernel a few at short lengths."""
    built = _BUILT if torch.compiler.is_compiling() else available()  # the engines call available() first
    return (built and key.device.type == "cpu" and key.dtype in CASTS and value.dtype in CASTS and key.is_contiguous()
            and value.is_contiguous() and max(key.shape[-1], value.shape[-1]) <= MAX_HEAD_DIM)


def dense_scores(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``query [b, hkv, g, 1, d]`` against every key of ``key [b, hkv, t, d]``: ``[b, hkv, g, 1, t]`` float32."""
    b, hkv, g, _, d = query.shape
    t = key.shape[2]
    every = torch.full((), t, dtype=torch.int64)
    scores = scores_op(CASTS[key.dtype], 0, d, d, key, None, None, every, query.reshape(b * hkv, g, d).float())
    return scores.view(b, hkv, g, 1, t)


def dense_values(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Weights ``probs [b, hkv, g, 1, t]`` over ``value [b, hkv, t, dv]``: ``[b, hkv, g, 1, dv]`` float32."""
    b, hkv, g, _, t = probs.shape
    dv = value.shape[-1]
    every = torch.full((), t, dtype=torch.int64)
    out = values_op(CASTS[value.dtype], 0, dv, dv, value, None, None, every, probs.reshape(b * hkv, g, t).float())
    return out.view(b, hkv, g, 1, dv)


def _head_scale(store: CodeStore, batch: int) -> torch.Tensor | float:
    """A store's static per-head scales as ``[batch x heads, 1, 1]`` (vLLM's calibrated fp8 cache: the kernel reads
    the codes alone and a head's scores and weighted values are scaled after), or 1."""
    scales = getattr(store.codec, "head_scale", None)
    if scales is None:
        return 1.0
    return torch.tensor(scales, dtype=torch.float32).repeat(batch).view(-1, 1, 1)


def _visible(scores: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None, scaling: float,
             softcap: float | None) -> torch.Tensor:
    """``scores [b, hkv, g, n]`` scaled (and soft-capped), -inf where not ``valid [n]`` or masked out by ``mask
    [b, 1, 1, n]`` (boolean, or added). Applied to each part (stored slots, ring) on its own, so that inductor computes
    the masks inside the softmax's loops instead of storing boolean rows of every position (stored one byte at a
    time, about 20 us a layer at 4,096 positions)."""
    scores = scores * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask.float()
    elif mask is not None:
        valid = valid & mask
    return torch.where(valid, scores, float("-inf"))


def plain_store(store: CodeStore) -> bool:
    """Whether a store's rows are read as they are: not rotated, no static per-head scale (the ring's rows then
    take the same query and the same weighted sum, in one call)."""
    return not getattr(store.codec, "rotate", False) and getattr(store.codec, "head_scale", None) is None


def _ring_positions(end: torch.Tensor, ring: int) -> torch.Tensor:
    """The position each of a ring's ``ring`` slots holds, the stores ending at ``end``: ``end + (r - end) mod
    ring``, the remainder taken once (a remainder per slot is a scalar int64 division in inductor's vector loops)."""
    r = torch.arange(ring, device=end.device)
    shift = end % ring
    return end + torch.where(r >= shift, r - shift, r - shift + ring)


def _attend_joined(layer: Any, q: torch.Tensor, end: torch.Tensor, length: torch.Tensor, mask: torch.Tensor | None,
                   scaling: float, softcap: float | None) -> torch.Tensor:
    """``attend`` for plain stores beside a float ring: one kernel call for the scores of the stored slots and the
    ring (a row of ``slots + ring`` per query head), one softmax over that row, one call for the weighted values
    of both: as a cache held whole is read (the stored part and the ring apart took two more calls and a softmax
    by parts, about 1 ms a SmolLM2-135M step at 4,096 positions). ``[b x hkv, g, dv]`` float32."""
    bh, g, _ = q.shape
    slots, ring = layer.slots, layer.ring_len
    ring_position = _ring_positions(end, ring)
    in_ring = torch.arange(slots + ring, device=q.device) >= slots
    position = torch.cat([torch.arange(slots, device=q.device), ring_position])  # the position each slot holds
    valid = position < torch.where(in_ring, length, end)
    joined_mask = None if mask is None else torch.cat(
        [mask[..., :slots], mask[..., ring_position.clamp(max=mask.shape[-1] - 1)]], -1)
    scores = ring_scores_op(*_store_args(layer.key_store), end, q, layer.keys)
    part = _visible(scores.view(layer.batch_size, layer.num_heads, g, slots + ring), valid, joined_mask, scaling,
                    softcap)
    weights = torch.exp(part - part.amax(-1, keepdim=True)).view(bh, g, slots + ring)
    return ring_values_op(*_store_args(layer.value_store), end, weights, layer.values) / weights.sum(-1, keepdim=True)


def attend(layer: Any, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float,
           softcap: float | None = None) -> torch.Tensor:
    """One decode row per query head (``query [b, hq, 1, d]``) over ``layer`` after its update: ``[b, 1, hq, dv]``.
    ``attention_mask``: transformers' mask over the layer's ``max_cache_len`` positions (boolean or additive).

    The stored slots hold positions ``0 .. slots - 1`` in order, so their part of the mask is a slice; only the
    ring's few slots are gathered. A ring in a float dtype is read by the same kernel's casts (torch's batched
    matmuls cost about 15 us a call at any size on CPU), else by ``torch.matmul``."""
    b, hq, _, d = query.shape
    hkv, slots, ring = layer.num_heads, layer.slots, layer.ring_len
    g = hq // hkv
    q = query.reshape(b * hkv, g, d).float()
    length = layer.cumulative_length
    end = layer._stored_end(length)  # a tensor: the layer's length is one
    mask = attention_mask[:, :, -1:, :] if attention_mask is not None else None  # [b, 1, 1, positions]
    dense_ring = ring and reads_dense(layer.keys, layer.values)
    if slots and dense_ring and plain_store(layer.key_store) and plain_store(layer.value_store):
        out = _attend_joined(layer, q, end, length, mask, scaling, softcap)
        return out.view(b, hq, 1, layer.v_head_dim).transpose(1, 2).to(query.dtype).contiguous()
    parts = []
    if slots:
        q_stored = layer.key_store.codec.rotation(q)  # as the stored keys were rotated
        stored = scores_op(*_store_args(layer.key_store), end, q_stored) * _head_scale(layer.key_store, b)
        parts.append(_visible(stored.view(b, hkv, g, slots), torch.arange(slots, device=query.device) < end,
                              None if mask is None else mask[..., :slots], scaling, softcap))
    if ring:
        ring_position = _ring_positions(end, ring)  # the position each ring slot holds
        if dense_ring:  # the ring as a store of b x hkv rows of ``ring`` slots
            recent = dense_scores(q.view(b, hkv, g, 1, d), layer.keys)
        else:
            recent = torch.matmul(q, layer.keys.reshape(b * hkv, ring, d).float().transpose(1, 2))
        ring_mask = None if mask is None else mask[..., ring_position.clamp(max=mask.shape[-1] - 1)]
        parts.append(_visible(recent.view(b, hkv, g, ring), ring_position < length, ring_mask, scaling, softcap))
    # the softmax part by part: one peak and one sum over both, the weighted values divided once at the end (no
    # joined row of every slot written and copied back out in two slices)
    peak = functools.reduce(torch.maximum, [part.amax(-1, keepdim=True) for part in parts])
    weights = [torch.exp(part - peak).view(b * hkv, g, -1) for part in parts]
    total = sum(w.sum(-1, keepdim=True) for w in weights)
    dv = layer.v_head_dim
    out = torch.zeros(b * hkv, g, dv, dtype=torch.float32, device=query.device)
    if slots:
        stored = values_op(*_store_args(layer.value_store), end, weights[0]) * _head_scale(layer.value_store, b)
        out = out + layer.value_store.codec.rotation(stored)  # the rotation is its own inverse
    if ring:
        if dense_ring:
            out = out + dense_values(weights[-1].view(b, hkv, g, 1, ring), layer.values).view(b * hkv, g, dv)
        else:
            out = out + torch.matmul(weights[-1], layer.values.reshape(b * hkv, ring, dv).float())
    out = out / total
    return out.view(b, hq, 1, dv).transpose(1, 2).to(query.dtype).contiguous()
