"""Running a model and reading the machine: the engines a recipe names (``base``: the interface and its registry;
``torch/``: quantlab's eager and compiled engines; ``llama_cpp/``: llama.cpp in a process of its own), device
choice and synchronization, memory (tensor bytes, peak memory) and the copy-bandwidth probe. Importing the package
registers the engines; each loads its heavy parts when it first measures."""
from . import llama_cpp, torch  # noqa: F401  (registration)
from .base import ENGINES, DecodeResult, Engine, engine

__all__ = ["ENGINES", "DecodeResult", "Engine", "engine"]
