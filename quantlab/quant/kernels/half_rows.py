"""A decode step's dense half-precision linears in C (``native/src/half_rows.c``): one row (or a few) of
activations times a float16 or bfloat16 weight as stored, float32 sums.

The compiled engine sends a one-row product with a 16-bit ``nn.Linear`` here (an unquantized model's linears, the
output head quantized models keep) where the kernel is vectorized (AVX-512; vdpbf16ps with AVX512-BF16), else to
``base.fused_row_matmul``'s compiled loop. On 2 Zen 5 cores (2026-12-07), SmolLM2-135M's bf16 output head
(49,152 x 576, 57 MB) takes 1.6 ms a step here (about 43 GB/s, the copy bandwidth) against 3.5-4.3 ms in the
compiled loop inside the step, and the int4-g32 step drops from 11.7 to 7.3 ms (``benchmarks/profile_decode.py
--half-linears``); alone, one product against the loop and ``aten::linear``: ``benchmarks/half_rows.py``.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from ... import native
from ...errors import UnsupportedError
from ...native.ops import native_op, register_fake

KINDS = {torch.float16: 1, torch.bfloat16: 2}  # native/src/common.h's dtype codes


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The built ``half_rows`` library (``flags``: extra compiler options, ``native.load``)."""
    lib = native.load("half_rows", flags)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.half_rows_matmul.argtypes = [p, p, p, i, i, i, i]
    lib.half_rows_matmul.restype = None
    lib.half_rows_path.argtypes, lib.half_rows_path.restype = [], i
    return lib


@functools.cache
def available() -> bool:
    """Whether the kernel builds here with a vectorized path (AVX-512), and its torch op's C++ kernel with it."""
    global _READY
    try:
        vectorized = library().half_rows_path() > 0
    except UnsupportedError:
        return False
    if vectorized:
        native.load_ops("half_rows")
    _READY = vectorized
    return vectorized


_READY = False  # set by available(): what a compiled graph reads (tracing available() would trace the build)


def ready() -> bool:
    """``available()`` as last computed, for code being compiled (call ``available()`` before compiling)."""
    return _READY


def half_rows_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M, in]`` times ``weight [out, in]`` (float16 or bfloat16, contiguous) transposed: ``[M, out]`` float32.
    ``x`` is read in the weight's dtype. ``half_rows_ops.cpp`` is the same call from the dispatcher."""
    x = x.to(weight.dtype).contiguous()
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    library().half_rows_matmul(weight.data_ptr(), x.data_ptr(), y.data_ptr(), KINDS[weight.dtype], x.shape[0],
                               weight.shape[0], x.shape[1])
    return y


matmul_op = native_op("half_rows_matmul", half_rows_matmul)


@register_fake(matmul_op)
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)


def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``matmul_op`` multiplies ``x [rows, in]`` by ``weight``: CPU, a contiguous 16-bit weight, ``x``
    in the same dtype, the kernel ready."""
    return (ready() and x.device.type == "cpu" and weight.dtype in KINDS and x.dtype == weight.dtype
            and weight.is_contiguous())
