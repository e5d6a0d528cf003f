"""``engine: llama.cpp``: a variant measured by llama.cpp itself (through llama-cpp-python, in a process of its own),
from the GGUF file quantlab exports of it. ``process.py`` is the child and its protocol, ``engine.py`` what the
measurements read of it (decode timing, window logits, the file's weight bytes). Everything the rest of quantlab
needs to know of llama.cpp is asked of this engine: what it refuses in a recipe, how it names a KV format's cache,
what it records."""
from __future__ import annotations

import importlib.util
from typing import Any

from ..base import ENGINES, Engine, Figure, Served
from .process import INSTALL

NAME = "llama.cpp"
FLOAT_CACHES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # a KV cast format's dtype -> cache type


class LlamaCppEngine(Engine):
    in_process = False

    def missing(self) -> str | None:
        return None if importlib.util.find_spec("llama_cpp") is not None else INSTALL

    def cache_type(self, kv: Any) -> str | None:
        """llama.cpp's K/V cache type holding ``kv``'s values: the model's own (f16, llama.cpp's default), a float
        cast, or llama.cpp's own block types (the ``ggml`` KV formats q8_0 / q4_0, rotated or not as the format
        says); quantlab's other packed caches have no llama.cpp twin."""
        from ...kv import KV_FORMATS

        name = KV_FORMATS.canonical_name(kv)
        if name == "native":
            return "f16"
        if name == "ggml":
            return kv.type
        if name == "cast" and getattr(kv, "scales", "position") == "position":
            return FLOAT_CACHES.get(getattr(kv, "dtype", ""))
        return None

    def refuse(self, recipe: Any) -> tuple[str, str] | None:
        w = recipe.workload
        batches = w.batch_size if isinstance(w.batch_size, list) else [w.batch_size]
        if any(b != 1 for b in batches):
            return "workload.batch_size", f"engine {NAME} decodes one sequence; workload.batch_size must be 1"
        for i, kv in enumerate(recipe.kv_cache):
            if self.cache_type(kv) is None:
                return f"kv_cache[{i}]", (f"engine {NAME} has no cache type for {kv.label}; allowed: native, fp16, "
                                          "bf16, fp32, q8_0, q4_0 (or measure it in a recipe of its own)")
        if recipe.baseline_variant.engine == NAME:
            return "baseline", ("the variants are compared with a baseline quantlab measures; list another engine "
                                "first in workload.engine, or name such a variant")
        return None

    def serve(self, ctx: Any) -> Served:
        from .engine import serve

        kv = ctx.variant.kv
        return serve(ctx, self.cache_type(kv), getattr(kv, "rotate", "none") == "hadamard")

    def note(self, rows: list[dict[str, Any]], figure: Figure) -> str:
        from .engine import note

        return note(rows, figure)


ENGINES.add(NAME, LlamaCppEngine, "the variant's GGUF export run by llama.cpp in a process of its own "
            "(llama-cpp-python; pip install -e '.[bench]')")
