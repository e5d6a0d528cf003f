"""ggml's quantized blocks (Q2_K … Q8_0, IQ4_NL, IQ4_XS, the legacy types) held as llama.cpp writes them
(``tensor``), quantized and multiplied by ggml's own code (``kernel``); ``codecs``: written to GGUF as they are."""
from . import codecs, kernel  # noqa: F401  (registration)
from .tensor import GGMLBlockTensor

__all__ = ["GGMLBlockTensor"]
