"""ggml block types (GGUF's Q4_K, Q6_K, Q8_0 …): ggml's own quantizer and dequantizer, and on CPU the stored
blocks multiplied as they are: ``ggml_repack_cpu`` (``auto``'s choice for Q4_0, IQ4_NL and Q4_K where the CPU has
AVX2) as llama.cpp multiplies them after repacking at load, eight rows interleaved and eight output rows a product;
``ggml_q8_cpu`` (``auto``'s choice for the other types) as llama.cpp's CPU backend multiplies a row at a time, the
activations of a decode step rounded to 8-bit blocks and ggml's integer dot products; ``ggml_cpu`` weight-only,
each block decoded to floats.

``quantize_ggml`` runs ggml's code (``native/third_party/ggml``, taken from ggml), so a tensor gives the bytes
llama.cpp's quantizer writes for it, with or without an importance matrix.

A decode step's few rows read the GGUF tensor's bytes as they are: ``ggml_matmul_q8`` through ggml's dot
products, ``ggml_matmul`` through ggml's dequantizer a chunk of each output row at a time into scratch. Longer
inputs dequantize a block of output rows at a time for the dense matmul. All are registered torch ops, so the
paths also run inside ``torch.compile``.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable, ClassVar

import torch

from .... import native
from ....errors import UnsupportedError
from ....native.ops import native_op, register_fake
from ...kernels.base import KERNELS, FusedRowsKernel, traced
from ...tensors.primitives import check_finite
from .tensor import FLOAT_SUBSTITUTE, GGML_TYPES, GGMLBlockTensor, row_bytes


@functools.cache
def _library() -> ctypes.CDLL:
    lib = native.load("ggml")
    p, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ggml_quantize_rows.argtypes = [i, p, p, i64, i64, i64, p]
    lib.ggml_dequantize_rows.argtypes = [i, p, p, i64, i64, i64, i64]
    lib.ggml_matmul.argtypes = [i, p, p, p, i64, i64, i64, i64, i64, i64]
    lib.ggml_matmul_q8.argtypes = [i, p, p, p, i64, i64, i64, i64, p]
    lib.ggml_q8_scratch_bytes.argtypes = [i, i64, i64]
    lib.ggml_q8_scratch_bytes.restype = i64
    lib.ggml_dot_available.argtypes = []
    lib.ggml_repack_available.argtypes = [i]
    lib.ggml_repack_rows.argtypes = [i, p, p, i64, i64]
    lib.ggml_unpack_rows.argtypes = [i, p, p, i64, i64, i64]
    lib.ggml_dequantize_repacked_rows.argtypes = [i, p, p, i, i64, i64, i64]
    lib.ggml_matmul_repacked.argtypes = [i, p, p, p, i64, i64, i64, i64, p]
    for f in (lib.ggml_quantize_rows, lib.ggml_dequantize_rows, lib.ggml_matmul, lib.ggml_matmul_q8,
              lib.ggml_dot_available, lib.ggml_repack_available, lib.ggml_repack_rows, lib.ggml_unpack_rows,
              lib.ggml_matmul_repacked, lib.ggml_dequantize_repacked_rows):
        f.restype = ctypes.c_int
    return lib


def dot_products_available() -> bool:
    """Whether ggml's integer dot products were built for this CPU (AVX2, FMA, F16C): ``ggml_q8_cpu``'s path."""
    try:
        return bool(_library().ggml_dot_available())
    except UnsupportedError:
        return False


def repack_available(ggml_type: str) -> bool:
    """Whether ``ggml_type`` has llama.cpp's repacked layout on this CPU (Q4_0, IQ4_NL, Q4_K with AVX2)."""
    try:
        return bool(_library().ggml_repack_available(GGML_TYPES[ggml_type].ggml_id)) and dot_products_available()
    except UnsupportedError:
        return False


def repack_blocks(blocks: torch.Tensor, ggml_type: str, n_in: int) -> torch.Tensor:
    """``blocks [out, row bytes]`` (``out`` a multiple of 8) with each eight rows interleaved as llama.cpp repacks
    them at load (``repack_*_8_bl``): as many bytes, in the same shape."""
    source = blocks.to("cpu").contiguous()
    packed = torch.empty_like(source)
    if _library().ggml_repack_rows(GGML_TYPES[ggml_type].ggml_id, source.data_ptr(), packed.data_ptr(),
                                   source.shape[0], n_in):
        raise UnsupportedError(f"{ggml_type} rows in eights have no repacked layout here ({source.shape[0]} rows)")
    return packed


def unpack_blocks(packed: torch.Tensor, ggml_type: str, n_in: int, row0: int = 0, row1: int | None = None) -> torch.Tensor:
    """Rows ``[row0, row1)`` of a repacked weight as the original blocks, byte for byte (``repack_blocks``'s
    inverse)."""
    row1 = packed.shape[0] if row1 is None else row1
    out = torch.empty(max(row1 - row0, 0), packed.shape[1], dtype=torch.uint8)
    if out.numel():
        _library().ggml_unpack_rows(GGML_TYPES[ggml_type].ggml_id, packed.data_ptr(), out.data_ptr(), row0, row1,
                                    n_in)
    return out


def quantize_blocks(x: torch.Tensor, ggml_type: str, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """``x [out, in]`` as ggml blocks, uint8 ``[out, row bytes]``: ggml's quantizer for the type (with the
    importance matrix ``imatrix [in]``, llama.cpp's per-column mean squared activation, when given)."""
    t = GGML_TYPES[ggml_type]
    if ggml_type == FLOAT_SUBSTITUTE:
        return x.detach().to("cpu", torch.float16).contiguous().view(torch.uint8)
    x = x.detach().to("cpu", torch.float32).contiguous()
    out, n_in = x.shape
    blocks = torch.empty(out, row_bytes(ggml_type, n_in), dtype=torch.uint8)
    weights = None
    if imatrix is not None:
        weights = imatrix.detach().to("cpu", torch.float32).contiguous()
        if weights.shape != (n_in,):
            raise UnsupportedError(f"an importance matrix for {n_in} inputs has {n_in} values, got {tuple(weights.shape)}")
    _library().ggml_quantize_rows(t.ggml_id, x.data_ptr(), blocks.data_ptr(), out, n_in, blocks.shape[1],
                                  None if weights is None else weights.data_ptr())
    return blocks


def dequantize_blocks(blocks: torch.Tensor, ggml_type: str, n_in: int, rows: slice | None = None) -> torch.Tensor:
    """The float32 weights ``[rows, in]`` of ggml blocks of a block type (ggml's dequantizer)."""
    rows = slice(None) if rows is None else rows  # a default slice breaks dynamo's graph (torch 2.11)
    start, stop, _ = rows.indices(blocks.shape[0])
    return _dequantize_rows(blocks, GGML_TYPES[ggml_type].ggml_id, n_in, start, stop).to(blocks.device)


def _dequantize_rows(blocks: torch.Tensor, ggml_id: int, n_in: int, start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of the blocks of the ggml type numbered ``ggml_id`` as float32 on the CPU."""
    source = blocks.to("cpu").contiguous()
    out = torch.empty(max(stop - start, 0), n_in, dtype=torch.float32)
    if out.numel():
        _library().ggml_dequantize_rows(ggml_id, source.data_ptr(), out.data_ptr(), start, stop, n_in,
                                        source.shape[1])
    return out


def quantize_ggml(x: torch.Tensor, ggml_type: str, imatrix: torch.Tensor | None = None) -> GGMLBlockTensor:
    """``x [out, in]`` in ``ggml_type`` (one of ``GGML_TYPES``; a row that is not whole blocks of it must be asked
    for in the type llama.cpp substitutes, ``row_type``)."""
    if ggml_type not in GGML_TYPES:
        raise UnsupportedError(f"ggml type {ggml_type!r}: one of {', '.join(GGML_TYPES)}")
    if x.dim() != 2:
        raise UnsupportedError(f"quantize_ggml expects a 2-D tensor, got shape {tuple(x.shape)}")
    check_finite(x)
    return GGMLBlockTensor(quantize_blocks(x, ggml_type, imatrix), ggml_type, tuple(x.shape))


def ggml_matmul(x: torch.Tensor, blocks: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """``x [M, in]`` (float32) times the weight held in ``blocks`` ``[out, row bytes]``, transposed: ``[M, out]``."""
    t = GGML_TYPES[ggml_type]
    x = x.contiguous()
    m, n_in = x.shape
    y = torch.empty(m, blocks.shape[0], dtype=torch.float32)
    _library().ggml_matmul(t.ggml_id, blocks.data_ptr(), x.data_ptr(), y.data_ptr(), m, blocks.shape[0], n_in,
                           blocks.shape[1], t.block, t.block_bytes)
    return y


def _q8_product(entry: Callable[..., int], x: torch.Tensor, blocks: torch.Tensor, ggml_id: int) -> torch.Tensor:
    """``x [M, in]`` times the weight through a C product against 8-bit activation blocks (``entry``:
    ``ggml_matmul_q8`` or ``ggml_matmul_repacked``, which share their arguments), with its scratch."""
    x = x.contiguous()
    m, n_in = x.shape
    scratch = torch.empty(_q8_scratch_bytes(ggml_id, m, n_in), dtype=torch.uint8)
    y = torch.empty(m, blocks.shape[0], dtype=torch.float32)
    entry(ggml_id, blocks.data_ptr(), x.data_ptr(), y.data_ptr(), m, blocks.shape[0], n_in, blocks.shape[1],
          scratch.data_ptr())
    return y


def ggml_matmul_q8(x: torch.Tensor, blocks: torch.Tensor, ggml_id: int) -> torch.Tensor:
    """``x [M, in]`` times the weight (of the ggml type numbered ``ggml_id``) as llama.cpp's CPU backend multiplies:
    each row of ``x`` rounded to the type's 8-bit activation blocks (Q8_0, Q8_1 or Q8_K), then ggml's integer dot
    product per output row. ``ggml_ops.cpp`` is the same call in C++."""
    return _q8_product(_library().ggml_matmul_q8, x, blocks, ggml_id)


def ggml_matmul_repacked(x: torch.Tensor, packed: torch.Tensor, ggml_id: int) -> torch.Tensor:
    """``x [M, in]`` times a repacked weight as llama.cpp's repacked CPU path multiplies it: each row of ``x`` in the
    type's 8-bit activation blocks, then ggml's GEMV over eight interleaved output rows at a time. ``ggml_ops.cpp``
    is the same call in C++."""
    return _q8_product(_library().ggml_matmul_repacked, x, packed, ggml_id)


def ggml_dequantize_repacked(packed: torch.Tensor, ggml_type: str, n_in: int, row0: int, row1: int,
                             dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of a repacked weight as ``dtype``: each row unpacked, then ggml's dequantizer, then
    (bfloat16) rounded, in one pass in C."""
    if dtype not in (torch.float32, torch.bfloat16):
        return ggml_dequantize_repacked(packed, ggml_type, n_in, row0, row1, torch.float32).to(dtype)
    out = torch.empty(max(row1 - row0, 0), n_in, dtype=dtype)
    if out.numel():
        failed = _library().ggml_dequantize_repacked_rows(GGML_TYPES[ggml_type].ggml_id, packed.data_ptr(),
                                                          out.data_ptr(), dtype == torch.bfloat16, row0, row1, n_in)
        if failed:
            raise MemoryError("ggml_dequantize_repacked: no scratch memory") if failed == -2 else \
                UnsupportedError(f"{ggml_type} has no repacked layout in this build")
    return out


@functools.cache
def _q8_scratch_bytes(ggml_id: int, m: int, n_in: int) -> int:
    """Bytes of ``m`` rows of ``n_in`` activations in the type's 8-bit blocks (asked of the C code once per shape)."""
    return int(_library().ggml_q8_scratch_bytes(ggml_id, m, n_in))


def ggml_dequantize(blocks: torch.Tensor, ggml_id: int, n_in: int, row0: int, row1: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the weight (of the ggml type numbered ``ggml_id``) as ``dtype``: prefill's row
    blocks, and a decode step's embedding rows (``ggml_ops.cpp`` is the same call in C++)."""
    return _dequantize_rows(blocks, ggml_id, n_in, row0, row1).to(blocks.device, dtype)


matmul_op = native_op("ggml_matmul", ggml_matmul)
matmul_q8_op = native_op("ggml_matmul_q8", ggml_matmul_q8)
dequantize_op = native_op("ggml_dequantize", ggml_dequantize)
matmul_repacked_op = native_op("ggml_matmul_repacked", ggml_matmul_repacked)
dequantize_repacked_op = native_op("ggml_dequantize_repacked", ggml_dequantize_repacked)


def _product_fake(x, blocks, ggml_type_or_id):  # type: ignore[no-untyped-def]
    return x.new_empty(x.shape[0], blocks.shape[0], dtype=torch.float32)


def _rows_fake(blocks, ggml_type_or_id, n_in, row0, row1, dtype):  # type: ignore[no-untyped-def]
    return blocks.new_empty(row1 - row0, n_in, dtype=dtype)


for _op in (matmul_op, matmul_q8_op, matmul_repacked_op):
    register_fake(_op)(_product_fake)
for _op in (dequantize_op, dequantize_repacked_op):
    register_fake(_op)(_rows_fake)


@KERNELS.register
class GGMLCPUKernel(FusedRowsKernel):
    """ggml blocks as stored; fused C product for decode rows, C dequantization of row blocks for longer inputs."""

    path = "ggml_cpu"
    preference = 58
    tensor_type: ClassVar[type] = GGMLBlockTensor

    @classmethod
    def supports(cls, q: GGMLBlockTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and q.ggml_type != FLOAT_SUBSTITUTE

    def __init__(self, q: GGMLBlockTensor, dtype: torch.dtype) -> None:
        super().__init__()
        _library()  # build (or find) the C code now: a failure passes the choice on
        self.shape, self.ggml_type = q.shape, q.ggml_type
        self.ggml_id = GGML_TYPES[q.ggml_type].ggml_id  # the C code's number for the type, as the ops take it
        self.register_buffer("blocks", q.blocks.contiguous())

    def analytic_nbytes(self) -> int:
        return GGMLBlockTensor.analytic_nbytes(self.shape, self.ggml_type)

    def stored(self) -> GGMLBlockTensor:
        return GGMLBlockTensor(self.blocks, self.ggml_type, self.shape)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(ggml_matmul, matmul_op)(x, self.blocks, self.ggml_type)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        return traced(ggml_dequantize, dequantize_op)(self.blocks, self.ggml_id, self.shape[1], row0, row1, dtype)


@KERNELS.register
class GGMLQ8CPUKernel(GGMLCPUKernel):
    """ggml blocks multiplied as llama.cpp's CPU backend does for decode rows: the activations rounded to 8-bit
    blocks (Q8_0, Q8_1, Q8_K by type) and ggml's own integer dot products (AVX2; vendored from ggml-cpu), so a
    GGUF type decodes at the speed llama.cpp gives it. Longer inputs dequantize row blocks for the dense matmul,
    as ``ggml_cpu`` does, so perplexity windows see the weights alone."""

    path = "ggml_q8_cpu"
    preference = 57

    def __init__(self, q: GGMLBlockTensor, dtype: torch.dtype) -> None:
        super().__init__(q, dtype)
        if not dot_products_available():
            raise UnsupportedError("ggml's integer dot products are built for AVX2 with FMA and F16C; this CPU "
                                   "lacks one of them")
        native.load_ops("ggml")  # the C++ kernels of its ops, where they build

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(ggml_matmul_q8, matmul_q8_op)(x, self.blocks, self.ggml_id)


@KERNELS.register
class GGMLRepackCPUKernel(GGMLQ8CPUKernel):
    """Q4_0, IQ4_NL and Q4_K as llama.cpp runs them on an AVX2 CPU (its ``REPACK = 1``): repacked once at load,
    eight rows' blocks interleaved eight bytes at a time (the same bytes, rearranged), and a decode step's product
    ggml's GEMV over eight output rows at once against the activations in 8-bit blocks (vendored from ggml-cpu's
    repack code). ``stored()`` gives the original blocks back byte for byte, so exports are unchanged; longer inputs
    unpack and dequantize row blocks for the dense matmul."""

    path = "ggml_repack_cpu"
    preference = 56

    @classmethod
    def supports(cls, q: GGMLBlockTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and q.shape[0] % 8 == 0 and repack_available(q.ggml_type)

    def __init__(self, q: GGMLBlockTensor, dtype: torch.dtype) -> None:
        super().__init__(q, dtype)
        self.blocks = repack_blocks(self.blocks, self.ggml_type, self.shape[1])

    def stored(self) -> GGMLBlockTensor:
        return GGMLBlockTensor(unpack_blocks(self.blocks, self.ggml_type, self.shape[1]), self.ggml_type, self.shape)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(ggml_matmul_repacked, matmul_repacked_op)(x, self.blocks, self.ggml_id)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        return traced(ggml_dequantize_repacked, dequantize_repacked_op)(self.blocks, self.ggml_type, self.shape[1],
                                                                         row0, row1, dtype)
