"""Static (preallocated) quantized KV caches, for the compiled engine: transformers static cache layers.

Each layer preallocates, for the generation's ``max_cache_len`` positions, a store of codes in the codec's layout
(``CodeStore``: packed integer rows with scales and zero points, per-channel blocks, or float casts with their
scales) and a full-precision ring of the most recent positions (the residual window, plus a channel-axis block
still filling). A decode step writes inside the graph: the position leaving the residual is quantized from the
ring into the store, the new one enters the ring. The keys and values it returns are an expression over the
store and the ring (positions read from codes where stored, from the ring where recent), for attentions that
take keys and values. The engine's attention (``engine/attention.py``) reads a global layer's stores itself for a
decode row (``code_attention.attend``: scores and weighted values computed in C from the stored codes, so the
expression is never evaluated in a compiled step); a sliding layer's, or a per-channel key store, through that
expression, which inductor fuses into the attention's products.

Stored positions and their codes are those of the dynamic layers (``packed.py``): the same rows quantized the
same way and moved at the same step, so a compiled step's logits match the eager model's with that format.
Sliding-window layers keep their window in a ring of codes (whole per-channel blocks where keys are stored
per channel, KIVI).
"""
from __future__ import annotations

import dataclasses

import torch

from ..errors import UnsupportedError
from ..quant.forms.affine.tensor import QuantizedTensor, quantize_tensor
from ..quant.forms.microscaling import MXTensor, NVFP4Tensor
from .code_attention import reads_codes
from .ggml_rows import GGML_ELEMENTS, rows_from_bytes
from .hf_compat import StaticLayer, StaticSlidingWindowLayer
from .packed import ELEMENTS, Codec, encode_element, hadamard_rotate, head_scales


def global_capacity(length: int, residual: int, block: int) -> tuple[int, int]:
    """(ring positions, stored positions) of a global layer of ``length`` positions: the stored ones in whole
    blocks, the ring holding the residual and a block still filling."""
    return min(length, residual + block - 1), max(0, length - residual) // block * block


def sliding_capacity(window: int, residual: int, block: int) -> tuple[int, int]:
    """(ring positions, stored positions) of a sliding layer whose window (min(window, cache length)) is
    ``window``: at most ``window - residual`` stored positions are visible, in at most
    ``ceil((window - residual) / block)`` blocks and one more where they do not start on a block's edge; a block
    is formed from the ring, which then holds ``residual + block - 1`` positions."""
    if window <= residual:
        return window, 0
    if block == 1:
        return residual, window - residual
    return residual + block - 1, (-(-(window - residual) // block) + 1) * block


def _mark_static(*tensors: torch.Tensor) -> None:
    if not torch.compiler.is_compiling():
        for t in tensors:
            torch._dynamo.mark_static_address(t)


class CodeStore:
    """``slots`` positions of ``[b, h, ·, d]`` states in one codec's stored layout, preallocated."""

    def __init__(self, codec: Codec, b: int, h: int, slots: int, d: int, device: torch.device) -> None:
        self.codec, self.shape, self.slots = codec, (b, h, d), slots
        if codec.element is not None:
            rows = self._encode(torch.zeros(b, h, 1, d, device=device))
            self.tensors = {name: torch.zeros(b, h, slots, t.shape[-1], dtype=t.dtype, device=device)
                            for name, t in rows.items()}
        elif codec.bits is None:
            fp8 = codec.dtype == torch.float8_e4m3fn  # held as its bytes: CPU index_copy_ has no float8
            self.tensors = {"data": torch.zeros(b, h, slots, d, dtype=torch.uint8 if fp8 else codec.dtype,
                                                device=device)}
            if fp8 and codec.head_scale is None:  # static per-head scales are the codec's, not stored
                self.tensors["scale"] = torch.ones(b, h, slots, 1, dtype=torch.float16, device=device)
        else:
            rows = self._encode(torch.zeros(b, h, codec.block, d, device=device))
            count = slots // codec.block if codec.axis == "channel" else slots
            self.tensors = {name: torch.zeros(count, *t.shape[1:], dtype=t.dtype, device=device)
                            if codec.axis == "channel" else
                            torch.zeros(b, h, count, t.shape[-1], dtype=t.dtype, device=device)
                            for name, t in rows.items()}
        _mark_static(*self.tensors.values())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def _group(self) -> int | None:
        return None if self.codec.group_size >= self.shape[2] else self.codec.group_size

    def _encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``x [b, h, n, d]`` in stored form: per position (token axis: ``[b, h, n, ·]``) or per block
        (channel axis: ``[n / block, b·h·d, ·]``)."""
        codec = self.codec
        if codec.rotate:
            x = hadamard_rotate(x, codec.rotate_block)
        if codec.element is not None:
            b, h, n, d = x.shape
            q = encode_element(x.reshape(b * h * n, d), codec.element)
            return {"codes": q.codes.view(torch.uint8).reshape(b, h, n, -1),
                    "scales": q.scales.view(torch.uint8).reshape(b, h, n, -1)}
        if codec.bits is None:
            chunk = dataclasses.replace(codec, rotate=False).encode(x)
            if chunk.scale is None:
                return {"data": chunk.data.view(torch.uint8) if codec.dtype == torch.float8_e4m3fn else chunk.data}
            return {"data": chunk.data.view(torch.uint8), "scale": chunk.scale}
        b, h, n, d = x.shape
        if codec.axis == "token":
            q = quantize_tensor(x.reshape(b * h * n, d).float(), codec.bits, self._group())
            return {name: getattr(q, name).reshape(b, h, n, -1) for name in ("packed", "scales", "zeros")}
        blocks = n // codec.block
        rows = x.reshape(b, h, blocks, codec.block, d).permute(2, 0, 1, 4, 3).reshape(blocks * b * h * d, codec.block)
        q = quantize_tensor(rows.float(), codec.bits, None)
        return {name: getattr(q, name).reshape(blocks, b * h * d, -1) for name in ("packed", "scales", "zeros")}

    def _decode(self, t: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        if not self.codec.rotate:
            return self._decode_stored(t, dtype)
        return hadamard_rotate(self._decode_stored(t, torch.float32), self.codec.rotate_block).to(dtype)

    def _decode_stored(self, t: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        codec = self.codec
        if codec.element is not None:
            b, h, d = self.shape
            n = t["codes"].shape[2]
            codes, scales = t["codes"].reshape(b * h * n, -1), t["scales"].reshape(b * h * n, -1)
            if codec.element in GGML_ELEMENTS:
                q = rows_from_bytes(codes, scales, (b * h * n, d), codec.element)
            elif codec.element == "nvfp4":
                q = NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), torch.ones(1, device=codes.device),
                                (b * h * n, d))
            else:
                element = ELEMENTS[codec.element][0]
                q = MXTensor(codes if element == "e2m1" else codes.view(torch.float8_e4m3fn), scales, (b * h * n, d),
                             element)
            return q.dequantize(torch.float32).reshape(b, h, n, d).to(dtype)
        if codec.bits is None:
            if codec.head_scale is not None:
                return (t["data"].view(codec.dtype).float() * head_scales(codec.head_scale, t["data"].device)).to(dtype)
            if "scale" not in t:
                return t["data"].to(dtype)
            return t["data"].view(codec.dtype).to(dtype) * t["scale"].to(dtype)
        b, h, d = self.shape
        if codec.axis == "token":
            n = t["packed"].shape[2]
            rows = b * h * n
            q = QuantizedTensor(t["packed"].reshape(rows, -1), t["scales"].reshape(rows, -1),
                                t["zeros"].reshape(rows, -1), (rows, d), codec.bits, self._group())
            return q.dequantize(dtype).reshape(b, h, n, d)
        blocks, rows = t["packed"].shape[0], t["packed"].shape[0] * b * h * d
        q = QuantizedTensor(t["packed"].reshape(rows, -1), t["scales"].reshape(rows, -1),
                            t["zeros"].reshape(rows, -1), (rows, codec.block), codec.bits, None)
        x = q.dequantize(dtype).reshape(blocks, b, h, d, codec.block)
        return x.permute(1, 2, 0, 4, 3).reshape(b, h, blocks * codec.block, d)

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as this store would give it back (stored, then read); a codec of no dtype keeps it as it is."""
        if self.codec.bits is None and self.codec.dtype is None and self.codec.element is None:
            return x
        return self._decode(self._encode(x), x.dtype)

    def write(self, slots: torch.Tensor, x: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Store ``x [b, h, n, d]`` at ``slots`` (``n`` slot indices; channel axis: whole blocks, in order).
        ``keep`` (a 0-d bool): write only where true, leaving the slots as they were otherwise."""
        new = self._encode(x)
        channel = self.codec.bits is not None and self.codec.axis == "channel"
        axis, index = (0, slots[:: self.codec.block] // self.codec.block) if channel else (2, slots)
        for name, buffer in self.tensors.items():
            value = new[name]
            if keep is not None:
                value = torch.where(keep, value, buffer.index_select(axis, index))
            buffer.index_copy_(axis, index, value)

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        """Every slot, dequantized: ``[b, h, slots, d]``."""
        return self._decode(self.tensors, dtype)

    def zero_(self) -> None:
        for t in self.tensors.values():
            t.zero_()


class _StaticPacked:
    """What the global and sliding static layers share: the two stores, the ring, their bytes."""

    key_store: CodeStore | None
    value_store: CodeStore | None

    def _setup(self, key_codec: Codec, value_codec: Codec, residual_tokens: int) -> None:
        self.key_codec, self.value_codec, self.residual_tokens = key_codec, value_codec, residual_tokens
        self.block = max(key_codec.block, value_codec.block)
        self.key_store = self.value_store = None
        self._reads_codes = False
        self.codes_attended = False  # set by the engine: the attention in effect reads the stores itself

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor, ring: int, slots: int) -> None:
        b, h, _, d = key_states.shape
        self.device, self.batch_size, self.num_heads = key_states.device, b, h
        self.k_head_dim, self.v_head_dim = d, value_states.shape[-1]
        self.ring_len, self.slots = ring, slots
        self.keys = torch.zeros(b, h, ring, d, dtype=key_states.dtype, device=self.device)
        self.values = torch.zeros(b, h, ring, self.v_head_dim, dtype=value_states.dtype, device=self.device)
        if slots:
            self.key_store = CodeStore(self.key_codec, b, h, slots, d, self.device)
            self.value_store = CodeStore(self.value_codec, b, h, slots, self.v_head_dim, self.device)
        self.cumulative_length = self.cumulative_length.to(self.device)
        _mark_static(self.keys, self.values, self.cumulative_length)
        self.is_initialized = True

    @property
    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        ring = sum(t.numel() * t.element_size() for t in (self.keys, self.values))
        return ring + sum(s.nbytes for s in (self.key_store, self.value_store) if s is not None)

    def _write_ring(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.ring_len:
            slots = positions % self.ring_len
            self.keys.index_copy_(2, slots, keys)
            self.values.index_copy_(2, slots, values)

    def _gather(self, positions: torch.Tensor, stored_end: torch.Tensor | int, dtype: torch.dtype,
                store_slot: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at ``positions`` (absolute): from the stores below ``stored_end``, else the ring.
        ``store_slot``: each position's slot in the stores (None: slot = position, the stores padded to the
        positions' count)."""
        out = []
        for store, ring in ((self.key_store, self.keys), (self.value_store, self.values)):
            recent = ring[:, :, positions % self.ring_len] if self.ring_len else None
            if store is None:
                out.append(recent)
                continue
            stored = store.read(dtype)
            if store_slot is not None:
                stored = stored[:, :, store_slot]
            elif stored.shape[2] < positions.shape[0]:  # a pad, not a gather: inductor fuses it into the read
                stored = torch.nn.functional.pad(stored, (0, 0, 0, positions.shape[0] - stored.shape[2]))
            if recent is None:
                out.append(stored)
                continue
            from_store = (positions < stored_end).view(1, 1, -1, 1)
            out.append(torch.where(from_store, stored, recent))
        return out[0], out[1]

    def _stored_end(self, written: torch.Tensor | int) -> torch.Tensor | int:
        over = (written - self.residual_tokens).clamp(min=0) if isinstance(written, torch.Tensor) \
            else max(0, written - self.residual_tokens)
        return over // self.block * self.block

    def _step(self, c: torch.Tensor, key: torch.Tensor, value: torch.Tensor, wrap: bool = False) -> None:
        """Write position ``c`` (a 0-d tensor): first the block it completes leaves the ring for the stores
        (``wrap``: the stores are a ring of their slots, a sliding layer's)."""
        if self.slots:
            if not self.ring_len:  # nothing kept in full precision: the position is stored as it comes
                slots = c.view(1) % self.slots if wrap else c.view(1)
                self.key_store.write(slots, key)
                self.value_store.write(slots, value)
            else:
                done = c + 1 - self.residual_tokens  # positions that must be stored once c is written
                first = (done // self.block - 1).clamp(min=0) * self.block
                positions = first + torch.arange(self.block, device=self.device)
                keep = ((done >= self.block) & (done % self.block == 0)) if self.block > 1 else None
                is_new = (positions == c).view(1, 1, -1, 1)
                slots = positions % self.slots if wrap else positions
                for store, ring, new in ((self.key_store, self.keys, key), (self.value_store, self.values, value)):
                    source = torch.where(is_new, new, ring[:, :, positions % self.ring_len])
                    store.write(slots, source, keep)
        self._write_ring(c.view(1), key, value)

    def _first_prompt_only(self) -> None:
        if int(self.cumulative_length):
            raise UnsupportedError("a static quantized KV cache takes one prefill, then one position per step")

    def reset(self) -> None:
        for store in (self.key_store, self.value_store):
            if store is not None:
                store.zero_()
        super().reset()


class StaticPackedLayer(_StaticPacked, StaticLayer):
    """A global-attention layer: ``max_cache_len`` positions, the oldest in the stores once they leave the
    residual window (blocks of ``block`` positions), the rest in a ring of ``residual + block - 1``."""

    def __init__(self, max_cache_len: int, key_codec: Codec, value_codec: Codec, residual_tokens: int) -> None:
        StaticLayer.__init__(self, max_cache_len=max_cache_len)
        self._setup(key_codec, value_codec, residual_tokens)

    def capacity(self) -> tuple[int, int]:
        """(ring positions, stored positions) this layer preallocates."""
        return global_capacity(self.max_cache_len, self.residual_tokens, self.block)

    @property
    def reads_codes(self) -> bool:
        """Whether a decode row attends over this layer's stores directly (``code_attention.attend``): decided
        once when the stores are allocated, so a compiled step reads a plain flag (no kernel build traced)."""
        return self.is_initialized and self._reads_codes

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._allocate(key_states, value_states, *self.capacity())
        self._reads_codes = reads_codes(self.key_store) and reads_codes(self.value_store)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if n == 1:
            self._step(self.cumulative_length, key_states, value_states)
        else:
            self._prefill(key_states, value_states)
        self.cumulative_length.add_(n)
        if n == 1 and self.codes_attended and self.reads_codes:  # the attention reads the stores: nothing to build
            return self.keys, self.values
        positions = torch.arange(self.max_cache_len, device=self.device)
        return self._gather(positions, self._stored_end(self.cumulative_length), key_states.dtype, None)

    def _prefill(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._first_prompt_only()
        n = keys.shape[-2]
        end = self._stored_end(n)
        if end:
            slots = torch.arange(end, device=self.device)
            self.key_store.write(slots, keys[:, :, :end])
            self.value_store.write(slots, values[:, :, :end])
        self._write_ring(torch.arange(end, n, device=self.device), keys[:, :, end:], values[:, :, end:])

class StaticPackedSlidingLayer(_StaticPacked, StaticSlidingWindowLayer):
    """A sliding-window layer: the last ``window`` positions, those past the residual in a ring of codes (whole
    blocks of ``block`` positions: a per-channel block straddling the window's edge is kept whole)."""

    def __init__(self, max_cache_len: int, sliding_window: int, key_codec: Codec, value_codec: Codec,
                 residual_tokens: int) -> None:
        StaticSlidingWindowLayer.__init__(self, max_cache_len=max_cache_len, sliding_window=sliding_window)
        self._setup(key_codec, value_codec, residual_tokens)

    @classmethod
    def full_precision(cls, max_cache_len: int, sliding_window: int) -> "StaticPackedSlidingLayer":
        """The window in the model's dtype, all of it in the ring (the native format's sliding layer)."""
        return cls(max_cache_len, sliding_window, Codec(), Codec(), residual_tokens=sliding_window)

    def capacity(self) -> tuple[int, int]:
        """(ring positions, stored positions) this layer preallocates (``sliding_capacity``)."""
        return sliding_capacity(self.max_cache_len, self.residual_tokens, self.block)

    # Lengths from the tensor counter: transformers' sliding layer reads a Python int, which a compiled step
    # specializes on (one recompilation per position, then eager once dynamo's limit is reached).
    @property
    def cumulative_length_int(self) -> int:
        return int(self.cumulative_length)

    @cumulative_length_int.setter
    def cumulative_length_int(self, value: int) -> None:
        pass  # derived from the tensor counter

    def get_seq_length(self) -> torch.Tensor | int:
        return self.cumulative_length if torch.compiler.is_compiling() else int(self.cumulative_length)

    def get_mask_sizes(self, query_length: int) -> tuple[int, torch.Tensor | int]:
        if query_length == 1 and torch.compiler.is_compiling():  # the window's positions, oldest first
            return self.max_cache_len, (self.cumulative_length - self.max_cache_len + 1).clamp(min=0)
        return super().get_mask_sizes(query_length)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._allocate(key_states, value_states, *self.capacity())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, dtype, c = key_states.shape[-2], key_states.dtype, self.cumulative_length
        if n == 1:
            self._step(c, key_states, value_states, wrap=True)
            offset, full = (c - self.max_cache_len + 1).clamp(min=0), None
        else:
            full, offset = self._prefill(key_states, value_states), 0
        self.cumulative_length.add_(n)
        if full is not None:
            return full
        positions = offset + torch.arange(self.max_cache_len, device=self.device)
        slot = positions % max(self.slots, 1)
        return self._gather(positions, self._stored_end(self.cumulative_length), dtype, slot)

    def _prefill(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Store a first prompt; returns its whole keys and values when it is longer than the window (as
        transformers' sliding layer does), else None (the window's view is returned)."""
        self._first_prompt_only()
        n = keys.shape[-2]
        end = self._stored_end(n)
        if self.slots and end:
            positions = torch.arange(max(0, end - self.slots), end, device=self.device)  # whole blocks
            self.key_store.write(positions % self.slots, keys[:, :, positions])
            self.value_store.write(positions % self.slots, values[:, :, positions])
        recent = torch.arange(max(end, n - self.ring_len), n, device=self.device)
        self._write_ring(recent, keys[:, :, recent], values[:, :, recent])
        if n <= self.max_cache_len:
            return None
        if not end:
            return keys, values
        stores = [store or CodeStore(codec, *states.shape[:2], 0, states.shape[-1], self.device)  # none kept
                  for store, codec, states in ((self.key_store, self.key_codec, keys),
                                               (self.value_store, self.value_codec, values))]
        return (torch.cat([stores[0].roundtrip(keys[:, :, :end]), keys[:, :, end:]], dim=2),
                torch.cat([stores[1].roundtrip(values[:, :, :end]), values[:, :, end:]], dim=2))
