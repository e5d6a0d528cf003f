"""KV caches in the microscaling forms: each position's key and value heads stored as NVFP4 (e2m1 in blocks of
16 with e4m3 scales; single-level, the global scale fixed at 1, since a cache has no tensor-wide maximum to take
one from as positions arrive), MXFP4 (e2m1, e8m0 scales per 32) or MXFP8 (e4m3, e8m0 per 32), optionally
Hadamard-rotated first (``rotate: hadamard``). The most recent ``residual_tokens`` positions stay in the model's
dtype. The compiled engine's decode attention reads them from their stored bytes (``code_attention.py``), rotated
or not; otherwise they are read through the dequantizing expression."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from .packed import Codec

from .format import KV_FORMATS, attention_shape
from .quantized import PackedKVFormat


@KV_FORMATS.register("microscaling", "keys and values in a microscaling form per position and head; fields: "
                     "element (nvfp4 | mxfp4 | mxfp8), residual_tokens, rotate")
class KVMicroscaling(PackedKVFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {"element": "nvfp4", "residual_tokens": 8}
    element: Literal["nvfp4", "mxfp4", "mxfp8"]
    residual_tokens: int = Field(0, ge=0, description="most recent positions kept in the model's dtype")

    @property
    def label(self) -> str:
        residual = f"-r{self.residual_tokens}" if self.residual_tokens else ""
        return f"{self.element}{residual}{self.rotation_label}"

    def serving_caches(self) -> dict[str, tuple[str, bool]]:
        return {"llama.cpp": ("q8_0" if self.element == "mxfp8" else "q4_0", False), "vllm": ("fp8", False)}

    def check(self, config: PretrainedConfig) -> str | None:
        from .packed import ELEMENTS

        head_dim, block = attention_shape(config)[2], ELEMENTS[self.element][1]
        if head_dim % block:
            return f"{self.element} stores blocks of {block} along the head; the head dimension is {head_dim}"
        return self.rotation_problem(config)

    def codecs(self) -> tuple[Codec, Codec, int]:
        from .packed import Codec

        key, value = self.rotations()
        return Codec(element=self.element, **key), Codec(element=self.element, **value), self.residual_tokens


for _element, _what in (("nvfp4", "e2m1 in blocks of 16 with e4m3 scales"),
                        ("mxfp4", "e2m1 with an e8m0 scale per 32"), ("mxfp8", "e4m3 with an e8m0 scale per 32")):
    KV_FORMATS.add(_element, KVMicroscaling, f"keys and values as {_what} "
                   "(fields: residual_tokens, rotate)", element=_element)
