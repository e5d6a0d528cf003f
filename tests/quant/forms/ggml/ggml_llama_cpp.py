"""llama.cpp's own quantizer (``ggml_quantize_chunk`` in the ggml library llama-cpp-python ships), for tests that
compare quantlab's blocks with it; ``None`` where llama-cpp-python is not installed."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np


def _lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent / "lib"


def ggml_library() -> ctypes.CDLL | None:
    folder = _lib_dir()
    if folder is None:
        return None
    lib = ctypes.CDLL(str(folder / "libggml-base.so"))
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


class _CPUTraits(ctypes.Structure):  # ggml-cpu.h's struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


def _cpu_library() -> ctypes.CDLL | None:
    """llama.cpp's CPU backend (libggml-cpu) with its type traits declared and initialised; ``None`` without
    llama-cpp-python."""
    folder = _lib_dir()
    if folder is None:
        return None
    lib = ctypes.CDLL(str(folder / "libggml-cpu.so"))
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_CPUTraits)
    lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    lib.ggml_cpu_init()
    return lib


def _activations(lib: ctypes.CDLL, ggml_id: int, x: np.ndarray) -> tuple[np.ndarray, _CPUTraits]:
    """``x`` (float32 ``[n]``) in the activation blocks the type multiplies against (its ``vec_dot_type``'s
    ``from_float``), and the type's traits."""
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    x = np.ascontiguousarray(x, dtype=np.float32)
    traits = lib.ggml_get_type_traits_cpu(ggml_id).contents
    activations = np.zeros(2 * x.size, np.uint8)
    from_float(lib.ggml_get_type_traits_cpu(traits.vec_dot_type).contents.from_float)(x.ctypes.data,
                                                                                      activations.ctypes.data, x.size)
    return activations, traits


def llama_cpp_cpu_product(ggml_id: int, blocks: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """``x`` (float32 ``[n]``) times each row of ``blocks`` as llama.cpp's CPU backend computes it: ``x`` in the
    type's activation blocks (its ``from_float``), then its ``vec_dot`` per row; ``None`` without llama-cpp-python."""
    lib = _cpu_library()
    if lib is None:
        return None
    vec_dot = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    activations, traits = _activations(lib, ggml_id, x)
    out = np.zeros(blocks.shape[0], np.float32)
    for r in range(blocks.shape[0]):
        row = np.ascontiguousarray(blocks[r])
        vec_dot(traits.vec_dot)(x.size, out[r:].ctypes.data, 0, row.ctypes.data, 0, activations.ctypes.data, 0, 1)
    return out


_GEMV = {"Q4_0": "ggml_gemv_q4_0_8x8_q8_0", "IQ4_NL": "ggml_gemv_iq4_nl_8x8_q8_0", "Q4_K": "ggml_gemv_q4_K_8x8_q8_K"}


def llama_cpp_repacked_product(ggml_type: str, ggml_id: int, packed: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """``x`` (float32 ``[n]``) times the rows of a weight repacked eight rows at a time (``packed``, uint8
    ``[out, row bytes]``), as llama.cpp's repacked CPU path computes it: ``x`` in the type's activation blocks, then
    ggml-cpu's own AVX2 GEMV (``ggml_gemv_<type>_8x8_*``) over all rows; ``None`` without llama-cpp-python."""
    lib = _cpu_library()
    if lib is None:
        return None
    gemv = getattr(lib, _GEMV[ggml_type])
    gemv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                     ctypes.c_int]
    gemv.restype = None
    activations, _ = _activations(lib, ggml_id, x)
    packed = np.ascontiguousarray(packed)
    out = np.zeros(packed.shape[0], np.float32)
    gemv(x.size, out.ctypes.data, 0, packed.ctypes.data, activations.ctypes.data, 1, packed.shape[0])
    return out
