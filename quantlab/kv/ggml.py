"""KV caches in llama.cpp's cache block types, ``q8_0`` and ``q4_0`` (the numerics: ``ggml_rows.py``); with
``rotate: hadamard`` (llama.cpp's default for quantized caches) they are what ``--cache-type-k/v q8_0 | q4_0``
stores, so the llama.cpp engine runs the same format."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from .packed import Codec

from .format import KV_FORMATS, attention_shape
from .ggml_rows import BLOCK
from .quantized import PackedKVFormat


@KV_FORMATS.register("ggml", "keys and values in llama.cpp's cache block types; fields: type (q8_0 | q4_0), rotate")
class KVGGML(PackedKVFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {"type": "q4_0"}
    type: Literal["q8_0", "q4_0"]

    @property
    def label(self) -> str:
        return self.type + self.rotation_label

    @property
    def residual_tokens(self) -> int:
        return 0  # llama.cpp stores every position in the cache type

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        # llama.cpp rotates a quantized cache whose head size is a multiple of 64 unless LLAMA_ATTN_ROT_DISABLE is set
        return {"llama.cpp": (self.type, self.rotate == "hadamard"), "vllm": ("fp8", False)}

    def check(self, config: PretrainedConfig) -> str | None:
        head_dim = attention_shape(config)[2]
        if head_dim % BLOCK:
            return f"{self.type} stores blocks of {BLOCK} along the head; the head dimension is {head_dim}"
        return self.rotation_problem(config)

    def codecs(self) -> tuple[Codec, Codec, int]:
        from .packed import Codec

        key, value = self.rotations()
        return Codec(element=self.type, **key), Codec(element=self.type, **value), 0


for _type, _what in (("q8_0", "8-bit codes with a float16 scale per 32"),
                     ("q4_0", "4-bit codes with a float16 scale per 32")):
    KV_FORMATS.add(_type, KVGGML, f"keys and values as llama.cpp's {_type} cache ({_what}; rotate: hadamard as "
                   "llama.cpp rotates it)", type=_type)
