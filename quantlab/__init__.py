"""quantlab: what do you lose and gain by storing a model's weights and KV cache in format X?

The public names load on first use, so ``import quantlab`` (and ``quantlab --help``) does not import torch.
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import QuantlabError, RecipeError, UnsupportedError

__version__ = "0.1.0"

_LAZY = {
    "KV_FORMATS": ".kv", "KVFormat": ".kv",
    "WEIGHT_FORMATS": ".quant", "WeightFormat": ".quant", "QuantizedLinear": ".quant", "QuantizedTensor": ".quant",
    "gptq_quantize": ".quant", "load_gptq": ".quant", "quantize_": ".quant", "quantize_tensor": ".quant",
    "save_gptq": ".quant",
    "MEASUREMENTS": ".measurements", "PERPLEXITY_PROTOCOLS": ".measure",
    "Recipe": ".recipe", "load_recipe": ".recipe", "validate_recipe": ".recipe",
    "run_recipe": ".runner", "RunFolder": ".records",
}

__all__ = ["QuantlabError", "RecipeError", "UnsupportedError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'quantlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
