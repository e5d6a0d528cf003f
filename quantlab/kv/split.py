"""Keys in one stored format and values in another (``{format: split, keys: {format: int8, group_size: 32},
values: {format: int4, group_size: 32}}``): llama.cpp's ``-ctk``/``-ctv`` and KIVI's asymmetric caches. Each side
is stored by its own format's codec, so its numerics and bytes are that format's; both keep the same recent
positions in full precision."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import field_validator, model_serializer, model_validator

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from .packed import Codec

from .format import KV_FORMATS, KVFormat
from .quantized import PackedKVFormat


def _member(entry: Any) -> PackedKVFormat:
    fmt = entry if isinstance(entry, KVFormat) else KV_FORMATS.build_entry(entry)
    if not isinstance(fmt, PackedKVFormat):
        raise ValueError(f"{fmt.label}: a side of a split cache is a stored format (int, fp8, ggml, microscaling, a "
                         "float cast)")
    return fmt


@KV_FORMATS.register("split", "keys in one stored format and values in another; fields: keys, values (each a KV "
                     "format entry; both keep the same residual_tokens)")
class SplitKV(PackedKVFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {
        "keys": {"format": "int8", "group_size": 32, "residual_tokens": 8},
        "values": {"format": "int4", "group_size": 32, "residual_tokens": 8}}
    keys: PackedKVFormat
    values: PackedKVFormat

    @field_validator("keys", "values", mode="before")
    @classmethod
    def _sides(cls, value: Any) -> PackedKVFormat:
        return _member(value)

    @model_validator(mode="after")
    def _compatible(self) -> "SplitKV":
        if self.rotate != "none":
            raise ValueError("rotate: set it on keys or values, each side rotates as its own format does")
        residual = {self.keys.codecs()[2], self.values.codecs()[2]}
        if len(residual) != 1:
            raise ValueError(f"keys keep {self.keys.codecs()[2]} recent positions in full precision and values "
                             f"{self.values.codecs()[2]}: give both the same residual_tokens")
        return self

    @model_serializer
    def _spec(self) -> dict[str, Any]:
        return {"keys": KV_FORMATS.recipe_entry(self.keys), "values": KV_FORMATS.recipe_entry(self.values)}

    @property
    def label(self) -> str:
        return f"k={self.keys.label},v={self.values.label}"

    @property
    def residual_tokens(self) -> int:
        return self.keys.codecs()[2]

    def check(self, config: PretrainedConfig) -> str | None:
        return self.keys.check(config) or self.values.check(config)

    def missing_dependency(self) -> str | None:
        return self.keys.missing_dependency() or self.values.missing_dependency()

    def codecs(self) -> tuple[Codec, Codec, int]:
        return self.keys.codecs()[0], self.values.codecs()[1], self.residual_tokens

    def layer_codecs(self, layer: int) -> tuple[Codec, Codec, int]:
        return self.keys.layer_codecs(layer)[0], self.values.layer_codecs(layer)[1], self.residual_tokens

    @property
    def calibrates(self) -> bool:
        return self.keys.calibrates or self.values.calibrates

    def calibrated(self, model: torch.nn.Module, samples: list[torch.Tensor], source: str = "") -> "SplitKV":
        if not self.calibrates:
            return self
        return self.model_copy(update={"keys": self.keys.calibrated(model, samples, source),
                                       "values": self.values.calibrated(model, samples, source)})

    def calibration(self) -> str | None:
        found = [f"{side} {c}" for side, f in (("keys", self.keys), ("values", self.values))
                 if (c := f.calibration()) is not None]
        return "; ".join(found) if found else None

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        """vLLM holds one cache dtype for keys and values: fp8 where either side is quantized."""
        keys, values = self.keys.serving_caches(), self.values.serving_caches()
        out: dict[str, tuple[str, bool]] = {}
        if "vllm" in keys and "vllm" in values:
            same = keys["vllm"][0] == values["vllm"][0]
            out["vllm"] = (keys["vllm"][0] if same else "fp8", same and keys["vllm"][1] and values["vllm"][1])
        return out

    def serving_cache_sides(self) -> dict[str, tuple[tuple[str, bool], tuple[str, bool]]]:
        out = super().serving_cache_sides()
        keys, values = self.keys.serving_caches(), self.values.serving_caches()
        if "llama.cpp" in keys and "llama.cpp" in values:  # llama.cpp's -ctk and -ctv
            out["llama.cpp"] = (keys["llama.cpp"], values["llama.cpp"])
        return out
