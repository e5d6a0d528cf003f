"""torch's CPU int4 packing read back in C (``native/src/int4pack.c``): output rows of a weight dequantized from
the very bytes ``torch._weight_int4pack_mm_for_cpu`` reads, so inputs of many rows take the dense matmul without a
second copy of the weight.

torch lays the codes out by the CPU capability it dispatches to (``torch.backends.cpu.get_cpu_capability()``), and
its packing is not a documented format, so each weight's layout is checked against its codes when it is packed
(``checked_layout``); a layout that does not read back leaves that weight on torch's kernel for every input."""
from __future__ import annotations

import ctypes
import functools
import platform

import torch

from .... import native
from ....errors import UnsupportedError
from ....native.ops import native_op, register_fake
from ...kernels.base import OUT_KINDS, traced

LAYOUTS = {"AVX512": 64, "AVX2": 32, "DEFAULT": 0}  # torch's CPU capability -> its int4 block of rows (int4pack.c)
SCALE_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
CHECKED_ROWS = 64  # rows read back at each end of a weight when it is packed (a whole block, and the last one)


@functools.cache
def _library() -> ctypes.CDLL:
    lib = native.load("int4pack")
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.int4pack_dequantize_t.argtypes = [p, p, i, p, i, i64, i64, i64, i64, i64, i]
    lib.int4pack_dequantize_t.restype = i
    return lib


def torch_layout() -> int | None:
    """How torch packs int4 codes for the CPU here (x86: by its dispatch capability), or None where unknown."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return LAYOUTS.get(torch.backends.cpu.get_cpu_capability())


def dequantize_t(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int, layout: int, row0: int,
                 row1: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the ``[out, in]`` weight packed as ``packed`` (``[out, in / 2]`` bytes) with
    ``scales_and_zeros [in / group, out, 2]``, transposed: ``[in, row1 - row0]`` of ``(code - 8) * scale + zero``
    as ``dtype`` (float32 or bfloat16), each value rounded once from torch's kernel's float32 one."""
    n_out, n_in = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(n_in, max(row1 - row0, 0), dtype=dtype)
    if out.numel() and _library().int4pack_dequantize_t(
            packed.data_ptr(), scales_and_zeros.data_ptr(), SCALE_KINDS[scales_and_zeros.dtype], out.data_ptr(),
            OUT_KINDS[dtype], row0, row1, n_out, n_in, group, layout):
        raise UnsupportedError(f"int4 rows: layout {layout} with groups of {group} cannot be read back")
    return out


dequantize_t_op = native_op("int4pack_dequantize_t", dequantize_t)


@register_fake(dequantize_t_op)
def _(packed, scales_and_zeros, group, layout, row0, row1, dtype):
    return packed.new_empty(packed.shape[1] * 2, row1 - row0, dtype=dtype)


def rows_t(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int, layout: int, row0: int, row1: int,
           dtype: torch.dtype) -> torch.Tensor:
    """``dequantize_t`` (as a torch op inside a compiled graph)."""
    return traced(dequantize_t, dequantize_t_op)(packed, scales_and_zeros, group, layout, row0, row1, dtype)


def checked_layout(codes: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int,
                   tail_packed: torch.Tensor | None = None, tail_scales_and_zeros: torch.Tensor | None = None,
                   tail: int = 0) -> int | None:
    """torch's layout for these packed ``codes [out, in]`` (kernel column order; the last ``tail`` columns packed
    apart), read back from the first and last rows and compared with the codes' values; None where it cannot be
    read here (not x86, no C compiler, or the values differ)."""
    layout = torch_layout()
    if layout is None:
        return None
    n_out, head = codes.shape[0], codes.shape[1] - tail
    parts = [(packed, scales_and_zeros, group, codes[:, :head])]
    if tail:
        parts.append((tail_packed, tail_scales_and_zeros, tail, codes[:, head:]))
    try:
        for rows0, rows1 in ((0, min(CHECKED_ROWS, n_out)), (max(0, n_out - CHECKED_ROWS), n_out)):
            for p, sz, g, c in parts:
                got = dequantize_t(p, sz, g, layout, rows0, rows1, torch.float32).t()
                scale = sz[..., 0].t()[rows0:rows1].float().repeat_interleave(g, dim=1)
                zero = sz[..., 1].t()[rows0:rows1].float().repeat_interleave(g, dim=1)
                want = (c[rows0:rows1].float() - 8) * scale + zero
                if not torch.allclose(got, want, rtol=1e-6, atol=1e-6 * float(scale.abs().max()) + 1e-30):
                    return None
    except UnsupportedError:
        return None
    return layout
