"""llama.cpp's own quantizer (``ggml_quantize_chunk`` in the ggml library llama-cpp-python ships), for tests that
compare quantlab's blocks with it; ``None`` where llama-cpp-python is not installed."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np


def ggml_library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(str(Path(spec.origin).parent / "lib" / "libggml-base.so"))
    p, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ggml_quantize_chunk.argtypes = [i, p, p, i64, i64, i64, p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [i, i64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_quantize_init.argtypes = [i]
    return lib


def llama_cpp_blocks(lib: ctypes.CDLL, ggml_id: int, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
    """``x`` (float32 ``[rows, n]``) quantized by ggml itself: uint8 ``[rows, row bytes]``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    lib.ggml_quantize_init(ggml_id)
    out = np.zeros((rows, lib.ggml_row_size(ggml_id, n)), np.uint8)
    weights = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    lib.ggml_quantize_chunk(ggml_id, x.ctypes.data, out.ctypes.data, 0, rows, n,
                            None if weights is None else weights.ctypes.data)
    return out
