"""Model loading: bundled, local folder, hub id, or a config with random (synthetic) weights."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .errors import QuantlabError
from .quant.format import DTYPES

if TYPE_CHECKING:
    from .recipe import ModelSpec

BUNDLED_DIR = Path(__file__).parent / "bundled"


def bundled_models() -> dict[str, Path]:
    """Models shipped inside the package, by name."""
    return {p.name: p for p in sorted(BUNDLED_DIR.iterdir()) if (p / "config.json").is_file()}


def package_folder(name: str) -> Path | None:
    """The folder of an installed package (found without importing it), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any | None  # None for synthetic models
    source: str


def _location(spec: "ModelSpec") -> tuple[str, dict[str, Any]]:
    if spec.bundled:
        return str(bundled_models()[spec.bundled]), {}
    if spec.path:
        return spec.path, {}
    if spec.package:
        return str(package_folder(spec.package)), {}
    if spec.config:
        return str(Path(spec.config).parent), {}
    return spec.hub or "", {"revision": spec.revision}


def model_location(spec: "ModelSpec") -> str:
    """Where the model's files are: a folder, a config.json, or a hub id."""
    return spec.config if spec.config else _location(spec)[0]


def load_config(spec: "ModelSpec") -> Any:
    """The model's transformers config (no weights are read)."""
    from transformers import AutoConfig

    where, kwargs = _location(spec)
    try:
        if spec.config:
            return AutoConfig.from_pretrained(spec.config, trust_remote_code=spec.trust_remote_code)
        if spec.gguf_file:
            kwargs["gguf_file"] = spec.gguf_file
        return AutoConfig.from_pretrained(where, trust_remote_code=spec.trust_remote_code, **kwargs)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QuantlabError(f"cannot load the model config from {where}: {first}") from None


def model_dtype_name(spec: "ModelSpec", config: Any) -> str:
    """The dtype the model is loaded in, by name (``float32``, ``bfloat16``, ``float16``)."""
    return str(_dtype(spec, config)).removeprefix("torch.")


def _dtype(spec: "ModelSpec", config: Any) -> torch.dtype:
    if spec.dtype != "auto":
        return DTYPES[spec.dtype]
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(declared, torch.dtype):
        return declared
    return DTYPES.get(str(declared), torch.float32)


def load_model(spec: "ModelSpec", device: str | torch.device = "cpu", seed: int = 0) -> LoadedModel:
    """Load a causal LM with transformers' own loading code (or random weights when synthetic)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = load_config(spec)
    dtype = _dtype(spec, config)
    where, kwargs = _location(spec)
    if spec.gguf_file:
        kwargs["gguf_file"] = spec.gguf_file
    if spec.synthetic:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=spec.trust_remote_code)
        tokenizer = None
    else:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=spec.trust_remote_code, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=spec.trust_remote_code, **kwargs)
    model.to(device).eval()
    model.requires_grad_(False)
    return LoadedModel(model, tokenizer, where)
