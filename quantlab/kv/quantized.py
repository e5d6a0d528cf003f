"""KV-cache formats that store keys and values in fewer bytes: float casts and packed integers."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr, model_validator

if TYPE_CHECKING:  # the cache layers subclass transformers' and load on first use
    from transformers import Cache, PretrainedConfig

    from .packed import Codec

from ..dtypes import DTYPES, SHORT_DTYPE
from .format import KV_FORMATS, KVFormat, attention_shape, layer_windows

CAST_DTYPES = {**DTYPES, "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None)}
SHORT = {**SHORT_DTYPE, "float8_e4m3fn": "fp8"}


class PackedKVFormat(KVFormat):
    """Shared cache building and byte counting of formats stored through ``PackedKVLayer``."""

    dequantizes_on_read: ClassVar[bool] = True
    rotate: Literal["none", "hadamard"] = Field("none", description="hadamard: each head's keys and values times a "
                                                "Walsh-Hadamard matrix before they are stored, undone when read, as "
                                                "llama.cpp rotates quantized caches (keys in blocks of the largest "
                                                "power of two dividing the head size, values in blocks of 64)")

    @property
    def rotation_label(self) -> str:
        return "-rot" if self.rotate == "hadamard" else ""

    def rotations(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The key and value codecs' rotation fields, as llama.cpp rotates: keys in blocks of the largest power of
        two dividing the head size (``rotate_block=None``), values in blocks of 64."""
        if self.rotate != "hadamard":
            return {}, {}
        return {"rotate": True, "rotate_block": None}, {"rotate": True}

    def rotation_problem(self, config: PretrainedConfig) -> str | None:
        """Why ``rotate`` cannot apply to this model's heads, or None."""
        from .packed import ROTATION_BLOCK

        head_dim = attention_shape(config)[2]
        if self.rotate == "hadamard" and head_dim % ROTATION_BLOCK:
            return f"rotate: hadamard needs a head dimension that is a multiple of {ROTATION_BLOCK}, got {head_dim}"
        return None

    def check(self, config: PretrainedConfig) -> str | None:
        return self.rotation_problem(config)

    def codecs(self) -> tuple[Codec, Codec, int]:
        """``(keys, values, residual_tokens)``: how every layer stores its positions (bytes follow from these)."""
        raise NotImplementedError

    def layer_codecs(self, layer: int) -> tuple[Codec, Codec, int]:
        """``codecs()`` of one decoder layer (a format with calibrated per-layer scales gives each its own)."""
        return self.codecs()

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        """Dynamic layers (``packed.py``), or with ``max_cache_len`` static ones (``static.py``)."""
        from transformers import Cache

        windows = layer_windows(config)
        codecs = [self.layer_codecs(i) for i in range(len(windows))]
        if max_cache_len is not None:
            from .static import StaticPackedLayer, StaticPackedSlidingLayer

            return Cache(layers=[StaticPackedLayer(max_cache_len, *c) if window is None
                                 else StaticPackedSlidingLayer(max_cache_len, window, *c)
                                 for window, c in zip(windows, codecs)])
        from .packed import PackedKVLayer, PackedSlidingKVLayer

        return Cache(layers=[PackedKVLayer(*c) if window is None else PackedSlidingKVLayer(window, *c)
                             for window, c in zip(windows, codecs)])

    def cache_bytes(self, cache: Cache) -> int:
        return sum(layer.nbytes for layer in cache.layers)

    def full_precision_tokens(self, tokens: int) -> int | None:
        from .packed import PackedKVLayer

        key, value, residual = self.codecs()
        return PackedKVLayer(key, value, residual).residual_after(tokens) if residual > 0 else None

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype,
                             static: bool = False) -> int:
        """Per layer: positions stored through the codecs + the residual in ``dtype``. A sliding-window layer
        keeps the last ``window - 1`` positions (a per-channel block straddling the edge whole). ``static``:
        the preallocated layout of a cache of ``tokens`` positions (``static.py``): a global layer stores
        ``(tokens - residual) // block * block`` positions and rings ``residual + block - 1`` (at most
        ``tokens``); a sliding layer of ``w = min(window, tokens)`` as ``static.sliding_capacity`` counts."""
        from .packed import PackedKVLayer

        _, heads, head_dim = attention_shape(config)
        key, value, residual_tokens = self.codecs()
        if static:
            return sum(self._static_layer_bytes(key, value, residual_tokens, window, batch_size, heads, head_dim,
                                                tokens, dtype.itemsize) for window in layer_windows(config))
        residual = PackedKVLayer(key, value, residual_tokens).residual_after(tokens)
        stored = tokens - residual
        itemsize = dtype.itemsize
        total = 0
        for window in layer_windows(config):
            cutoff = 0 if window is None else max(0, tokens - (window - 1))
            kept = [stored - min(stored, cutoff // codec.block * codec.block) for codec in (key, value)]
            kept_residual = tokens - max(stored, cutoff)
            total += (key.nbytes(batch_size, heads, kept[0], head_dim) + value.nbytes(batch_size, heads, kept[1], head_dim)
                      + 2 * batch_size * heads * kept_residual * head_dim * itemsize)
        return total


    @staticmethod
    def _static_layer_bytes(key: Codec, value: Codec, residual: int, window: int | None, b: int, h: int, d: int,
                            tokens: int, itemsize: int) -> int:
        from .static import global_capacity, sliding_capacity

        block = max(key.block, value.block)
        ring, stored = (global_capacity(tokens, residual, block) if window is None
                        else sliding_capacity(min(window, tokens), residual, block))
        return key.nbytes(b, h, stored, d) + value.nbytes(b, h, stored, d) + 2 * b * h * ring * d * itemsize


@KV_FORMATS.register("cast", "keys and values cast to a float dtype (fields: dtype; for fp8, scales: a scale per "
                     "position, or static per-head or per-layer scales calibrated on the recipe's calibration text)")
class KVCast(PackedKVFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {"dtype": "float8_e4m3fn"}
    dtype: Literal["float32", "bfloat16", "float16", "float8_e4m3fn"]
    scales: Literal["position", "head", "layer"] = Field(
        "position", description="fp8 only. position: a float16 scale per position and head, taken as each arrives; "
        "head: one static scale per layer and KV head (vLLM's per-head k/v scales, llm-compressor's attn_head "
        "strategy), layer: one per layer (vLLM's k_scale/v_scale), both max|x| / 448 over the calibration text, "
        "values past it saturating")
    _calibrated: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...] | None = PrivateAttr(None)
    _calibration: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _supported(self) -> "KVCast":
        if CAST_DTYPES[self.dtype] is None:
            raise ValueError(f"this torch has no {self.dtype}")
        if self.rotate != "none" and self.dtype != "float8_e4m3fn":
            raise ValueError(f"rotate is for quantized caches; {self.dtype} keeps keys and values as they are")
        if self.scales != "position" and self.dtype != "float8_e4m3fn":
            raise ValueError(f"scales is for fp8; {self.dtype} stores keys and values without a scale")
        return self

    @property
    def label(self) -> str:
        static = "" if self.scales == "position" else f"-{self.scales}"
        return SHORT[self.dtype] + static + self.rotation_label

    @property
    def calibrates(self) -> bool:
        return self.scales != "position"

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        if self.dtype == "float8_e4m3fn":  # vLLM's fp8 cache: static per-layer (or per-head) scales
            return {"llama.cpp": ("q8_0", False), "vllm": ("fp8", self.scales != "position" and self.rotate == "none")}
        return {"llama.cpp": ({"float32": "f32", "bfloat16": "bf16"}.get(self.dtype, "f16"), True),
                "vllm": ("auto", False)}

    def calibrated(self, model: torch.nn.Module, samples: list[torch.Tensor], source: str = "") -> "KVCast":
        """Static scales ``max|x| / 448`` per layer and KV head (``scales: head``) or per layer (``layer``), over
        every position ``samples`` put in the cache (rotated first under ``rotate``)."""
        if not self.calibrates:
            return self
        from .calibrate import kv_absmax
        from .packed import E4M3_MAX, FP16_TINY

        key, value = self.codecs()[:2]
        maxima = kv_absmax(model, samples, key.rotation, value.rotation)

        def scales(m: torch.Tensor) -> tuple[float, ...]:
            m = m if self.scales == "head" else m.amax().expand_as(m)
            return tuple(float(x) for x in (m / E4M3_MAX).clamp(min=FP16_TINY))

        out = self.model_copy()
        out._calibrated = tuple((scales(k), scales(v)) for k, v in maxima)
        tokens = sum(int(s.numel()) for s in samples)
        out._calibration = (f"static fp8 scales per {'KV head' if self.scales == 'head' else 'layer'}: max|x| / 448 "
                            f"of the keys (after the rotary embedding) and values over {len(samples)} calibration "
                            f"windows, {tokens:,} tokens{f' of {source}' if source else ''}, on the variant's own "
                            "weights; values past them saturate at ±448")
        return out

    def calibration(self) -> str | None:
        return self._calibration

    def codecs(self) -> tuple[Codec, Codec, int]:
        from .packed import Codec

        static = () if self.calibrates else None  # static scales: none stored per position (their values: layer_codecs)
        key, value = self.rotations()
        return (Codec(dtype=CAST_DTYPES[self.dtype], head_scale=static, **key),
                Codec(dtype=CAST_DTYPES[self.dtype], head_scale=static, **value), 0)

    def layer_codecs(self, layer: int) -> tuple[Codec, Codec, int]:
        if not self.calibrates:
            return self.codecs()
        if self._calibrated is None:
            from ..errors import UnsupportedError

            raise UnsupportedError(f"KV format {self.label} keeps static scales: calibrate it first "
                                   "(format.calibrated(model, samples); a run does so on its calibration text)")
        from .packed import Codec

        key, value = self._calibrated[layer]
        key_rotation, value_rotation = self.rotations()
        return (Codec(dtype=CAST_DTYPES[self.dtype], head_scale=key, **key_rotation),
                Codec(dtype=CAST_DTYPES[self.dtype], head_scale=value, **value_rotation), 0)


@KV_FORMATS.register("int", "keys and values as packed integers; fields: bits, key_axis, group_size, residual_tokens")
class KVInt(PackedKVFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {"bits": 4, "group_size": 32, "residual_tokens": 8}
    bits: int = Field(ge=2, le=8)
    key_axis: Literal["token", "channel"] = Field("token", description="channel: per-channel keys (KIVI)")
    group_size: int = Field(64, gt=0, description="token axis: channels per scale; channel axis: positions per scale")
    residual_tokens: int = Field(128, ge=0, description="most recent positions kept in the model's dtype")

    @model_validator(mode="after")
    def _power_of_two(self) -> "KVInt":
        if self.group_size & (self.group_size - 1):
            raise ValueError(f"group_size must be a power of two, got {self.group_size}")
        return self

    @property
    def label(self) -> str:
        keys = "kc" if self.key_axis == "channel" else "g"
        return f"int{self.bits}-{keys}{self.group_size}-r{self.residual_tokens}{self.rotation_label}"

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        return {"llama.cpp": ("q8_0" if self.bits >= 8 else "q4_0", False), "vllm": ("fp8", False)}

    def check(self, config: PretrainedConfig) -> str | None:
        head_dim = attention_shape(config)[2]
        if head_dim % self.group_size:  # values (and token-axis keys) group along the head dimension
            return f"group_size {self.group_size} does not divide the head dimension {head_dim}"
        return self.rotation_problem(config)

    def codecs(self) -> tuple[Codec, Codec, int]:
        from .packed import Codec

        key_rotation, value_rotation = self.rotations()
        key = Codec(bits=self.bits, axis=self.key_axis, group_size=self.group_size, **key_rotation)
        value = Codec(bits=self.bits, axis="token", group_size=self.group_size, **value_rotation)
        return key, value, self.residual_tokens


for _name, _dtype in (("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"), ("fp8", "float8_e4m3fn")):
    KV_FORMATS.add(_name, KVCast, f"keys and values stored as {_dtype}", dtype=_dtype)
KV_FORMATS.add("int8", KVInt, "8-bit keys and values, per position in groups of channels", bits=8)
KV_FORMATS.add("int4", KVInt, "4-bit keys and values, per position in groups of channels", bits=4)
KV_FORMATS.add("int2", KVInt, "2-bit keys and values (key_axis: channel for KIVI)", bits=2)
