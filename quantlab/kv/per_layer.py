"""A KV cache whose decoder layers are stored in different formats (``{format: per-layer, default: native,
layers: [{layers: [0, 1, 2], format: int4}, ...]}``): what a joint weights + KV plan deploys, and what vLLM's
``--kv-cache-dtype-skip-layers`` and per-layer cache precision express. Each layer is the layer its own format's
cache would hold, so its numerics, bytes and calibration are that format's."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

if TYPE_CHECKING:
    from transformers import Cache, PretrainedConfig

from .format import KV_FORMATS, KVFormat, layer_kv_bytes, layer_windows


def build_kv_format(entry: Any) -> KVFormat:
    """A KV format from its recipe form: ``NAME`` or ``{format: NAME, field: value...}`` (a format as is)."""
    return entry if isinstance(entry, KVFormat) else KV_FORMATS.build_entry(entry)


def kv_format_entry(fmt: KVFormat) -> dict[str, Any]:
    """The recipe form of ``fmt``: its registered name and the fields set away from their defaults."""
    return KV_FORMATS.recipe_entry(fmt)


class LayerFormat(BaseModel):
    """Decoder layers (indices from 0) whose keys and values take ``format``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    layers: tuple[int, ...] = Field(min_length=1)
    format: KVFormat

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """Accept ``{layers: [...], format: NAME, field: value...}`` and a single layer index."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("layers"), int):
            data["layers"] = (data["layers"],)
        return KV_FORMATS.nested_entry(data, "layers", KVFormat)

    @field_validator("layers")
    @classmethod
    def _indices(cls, layers: tuple[int, ...]) -> tuple[int, ...]:
        if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
            raise ValueError("layers: distinct indices from 0")
        return tuple(sorted(layers))

    @model_serializer
    def _spec(self) -> dict[str, Any]:
        return {"layers": list(self.layers), **kv_format_entry(self.format)}


def _ranges(layers: tuple[int, ...]) -> str:
    """``0-3,7`` for layers 0, 1, 2, 3 and 7."""
    parts, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + (None,)):
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(parts)


@KV_FORMATS.register("per-layer", "each decoder layer's keys and values in a format of its own; fields: default (the "
                     "format of the layers not named), layers (a list of {layers: [indices], format: ...})")
class PerLayerKV(KVFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {"default": "native",
                                                       "layers": [{"layers": [0], "format": "int8", "group_size": 32}]}
    default: KVFormat = Field(default_factory=lambda: KV_FORMATS["native"].build(),
                              description="the format of every layer that layers does not name")
    layers: tuple[LayerFormat, ...] = Field(min_length=1, description="the layers stored in another format")

    @field_validator("default", mode="before")
    @classmethod
    def _default(cls, value: Any) -> KVFormat:
        return build_kv_format(value)

    @model_validator(mode="after")
    def _distinct(self) -> "PerLayerKV":
        named = [i for entry in self.layers for i in entry.layers]
        if len(set(named)) != len(named):
            raise ValueError("layers: a layer is named twice")
        if any(isinstance(f, PerLayerKV) for f in self._members()):
            raise ValueError("a per-layer format cannot hold another per-layer format")
        return self

    @model_serializer
    def _spec(self) -> dict[str, Any]:
        return {"default": kv_format_entry(self.default), "layers": [entry._spec() for entry in self.layers]}

    def _members(self) -> list[KVFormat]:
        return [self.default, *(entry.format for entry in self.layers)]

    def format_of(self, layer: int) -> KVFormat:
        """The format decoder layer ``layer`` is stored in."""
        return next((entry.format for entry in self.layers if layer in entry.layers), self.default)

    @property
    def label(self) -> str:
        return "+".join([self.default.label, *(f"{e.format.label}@L{_ranges(e.layers)}" for e in self.layers)])

    def check(self, config: PretrainedConfig) -> str | None:
        count = len(layer_windows(config))
        beyond = sorted(i for entry in self.layers for i in entry.layers if i >= count)
        if beyond:
            return f"layers {beyond} do not exist: the model has {count} decoder layers (0-{count - 1})"
        return next((why for f in self._members() if (why := f.check(config)) is not None), None)

    def missing_dependency(self) -> str | None:
        return next((why for f in self._members() if (why := f.missing_dependency()) is not None), None)

    def check_positions(self, positions: int) -> tuple[str, str] | None:
        return next((p for f in self._members() if (p := f.check_positions(positions)) is not None), None)

    def full_precision_tokens(self, tokens: int) -> int | None:
        """The recent positions kept unquantized where every member keeps the same count, else None."""
        found = {f.full_precision_tokens(tokens) for f in self._members()}
        return found.pop() if len(found) == 1 else None

    @property
    def calibrates(self) -> bool:
        return any(f.calibrates for f in self._members())

    def calibrated(self, model: torch.nn.Module, samples: list[torch.Tensor], source: str = "") -> "KVFormat":
        default = self.default.calibrated(model, samples, source)
        layers = tuple(entry.model_copy(update={"format": entry.format.calibrated(model, samples, source)})
                       for entry in self.layers)
        return self.model_copy(update={"default": default, "layers": layers})

    def calibration(self) -> str | None:
        found = [c for f in self._members() if (c := f.calibration()) is not None]
        return "; ".join(found) if found else None

    def make_cache(self, config: PretrainedConfig, max_cache_len: int | None = None) -> Cache:
        """Each layer taken from the cache its own format makes for this config (one cache made per format)."""
        from transformers import Cache

        made: dict[int, Cache] = {}
        layers = []
        for i in range(len(layer_windows(config))):
            fmt = self.format_of(i)
            if id(fmt) not in made:
                made[id(fmt)] = fmt.make_cache(config, max_cache_len)
            layers.append(made[id(fmt)].layers[i])
        return Cache(layers=layers)

    def cache_bytes(self, cache: Cache) -> int:
        from transformers import Cache as HFCache

        total = 0
        for i, layer in enumerate(cache.layers):
            one = HFCache(layers=[layer])
            total += self.format_of(i).cache_bytes(one)
        return total

    def cache_bytes_analytic(self, config: PretrainedConfig, batch_size: int, tokens: int, dtype: torch.dtype,
                             static: bool = False) -> int | None:
        per_format = {id(f): layer_kv_bytes(f, config, batch_size, tokens, dtype, static) for f in self._members()}
        found = [per_format[id(self.format_of(i))][i] for i in range(len(layer_windows(config)))]
        return None if None in found else sum(found)  # type: ignore[arg-type]
