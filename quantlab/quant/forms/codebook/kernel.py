"""4-bit codebook weights (NF4, FP4) on CPU: the stored codes multiplied through a 16-entry table in registers.

Without it a codebook weight is dequantized whole for every matmul (hundreds of ms a decode step on 2 cores
for a 135M model). Here the codes stay as stored (two per byte) with their block maxima as stored (float32, or
8-bit double-quantized, decoded per block in the kernel), so the bytes held are the format's: a decode step's
few rows are multiplied directly (``native/lut4.c``), and longer inputs dequantize a block of rows at a time in
C for the dense matmul. Both are registered torch ops, so the path also runs inside ``torch.compile``.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from .... import native
from ....native.ops import native_op, register_fake
from ...kernels.base import KERNELS, OUT_KINDS, FusedRowsKernel, bf16_or_float32, traced
from .tensor import CODEBOOKS, CodebookTensor, dynamic_map

ABSMAX_F32, ABSMAX_DQ = 0, 1


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The built ``lut4`` library (also multiplies the microscaling forms' e2m1 codes, ``quant.forms``;
    ``flags``: extra compiler options, ``native.load``)."""
    lib = native.load("lut4", flags)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.lut4_matmul.argtypes = lib.lut4_matmul_bf16.argtypes = [p, p, i, p, p, p, p, p, p, i, i, i, i]
    lib.lut4_dequantize.argtypes = [p, p, i, p, p, p, p, p, i, i, i, i, i]
    lib.lut4_matmul.restype = lib.lut4_dequantize.restype = None
    lib.lut4_matmul_bf16.restype = i
    return lib


@functools.cache
def _table(codebook: str) -> torch.Tensor:
    """The codebook's 16 values, float32 (a constant shared by every weight, not part of any)."""
    return torch.tensor(CODEBOOKS[codebook], dtype=torch.float32)


@functools.cache
def _dmap() -> torch.Tensor:
    return dynamic_map().contiguous()


def _scales(absmax: torch.Tensor, scale2: torch.Tensor | None, offset: torch.Tensor | None) -> tuple[int, int, int | None, int | None]:
    if scale2 is None:
        return absmax.data_ptr(), ABSMAX_F32, None, None
    return absmax.data_ptr(), ABSMAX_DQ, scale2.data_ptr(), offset.data_ptr()  # type: ignore[union-attr]


def lut4_matmul(x: torch.Tensor, packed: torch.Tensor, absmax: torch.Tensor, scale2: torch.Tensor | None,
                offset: torch.Tensor | None, table: torch.Tensor, dmap: torch.Tensor, block: int) -> torch.Tensor:
    """``x [M, in]`` (float32, or bfloat16 as a bf16 model's activations are) times the codebook weight
    ``[out, in]``, transposed: ``[M, out]`` float32; ``table`` the codebook's 16 values and ``dmap`` the double
    quantization's 256 (float32). ``lut4_ops.cpp`` is the same call in C++."""
    return lut4_product(x, packed, _scales(absmax, scale2, offset), dmap, table, block)


def lut4_product(x: torch.Tensor, packed: torch.Tensor, scales: tuple, dmap: torch.Tensor, table: torch.Tensor,
                 block: int) -> torch.Tensor:
    """The C product for x bfloat16 as it is, or widened to float32; ``scales``: the C call's four scale
    arguments (address, kind, second-level scales, offset)."""
    x = bf16_or_float32(x)
    m, n_in = x.shape
    y = torch.empty(m, packed.shape[0], dtype=torch.float32)
    lib = library()
    product = lib.lut4_matmul_bf16 if x.dtype == torch.bfloat16 else lib.lut4_matmul
    if product(packed.data_ptr(), *scales, dmap.data_ptr(), table.data_ptr(), x.data_ptr(), y.data_ptr(), m,
               packed.shape[0], n_in, block):
        raise MemoryError("lut4_matmul: out of memory")
    return y


def lut4_dequantize(packed: torch.Tensor, absmax: torch.Tensor, scale2: torch.Tensor | None,
                    offset: torch.Tensor | None, codebook: str, block: int, n_in: int, row0: int, row1: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the weight as ``dtype`` (float32 or bfloat16)."""
    out = torch.empty(row1 - row0, n_in, dtype=dtype)
    library().lut4_dequantize(packed.data_ptr(), *_scales(absmax, scale2, offset), _dmap().data_ptr(),
                               _table(codebook).data_ptr(), out.data_ptr(), OUT_KINDS[dtype], row0, row1, n_in, block)
    return out


# The same functions as torch ops, for torch.compile.
matmul_op = native_op("lut4_matmul", lut4_matmul)
dequantize_op = native_op("lut4_dequantize", lut4_dequantize)


@register_fake(matmul_op)
def _(x, packed, absmax, scale2, offset, table, dmap, block):
    return x.new_empty(x.shape[0], packed.shape[0], dtype=torch.float32)


@register_fake(dequantize_op)
def _(packed, absmax, scale2, offset, codebook, block, n_in, row0, row1, dtype):
    return packed.new_empty(row1 - row0, n_in, dtype=dtype)


@KERNELS.register
class Lut4CPUKernel(FusedRowsKernel):
    """A 4-bit codebook weight as stored (codes two per byte, block maxima float32 or double-quantized); fused C
    matmul through the table for decode steps, C dequantization of row blocks for longer inputs."""

    path = "lut4_cpu"
    preference = 55
    tensor_type = CodebookTensor

    def __init__(self, q: CodebookTensor, dtype: torch.dtype) -> None:
        super().__init__()
        library()  # build (or find) the C kernel now: a failure passes the choice on
        native.load_ops("lut4")  # and its ops' C++ kernels, where they build
        self.shape, self.codebook, self.block = q.shape, q.codebook, q.block_size
        self.bits, self.group_size = 4, q.block_size
        self.table, self.dmap = _table(q.codebook), _dmap()  # constants shared by every weight, not buffers
        self.register_buffer("packed", q.packed.contiguous())
        self.register_buffer("absmax", q.absmax.contiguous())
        self.register_buffer("absmax_scale", None if q.absmax_scale is None else q.absmax_scale.float().contiguous())
        self.register_buffer("absmax_offset", None if q.absmax_offset is None else q.absmax_offset.float().contiguous())

    @classmethod
    def supports(cls, q: CodebookTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return (device.type == "cpu" and dtype in OUT_KINDS and q.block_size % 32 == 0 and q.shape[1] % q.block_size == 0
                and q.codebook in CODEBOOKS and q.absmax.dtype in (torch.float32, torch.uint8))

    def analytic_nbytes(self) -> int:
        return CodebookTensor.analytic_nbytes(self.shape, self.block, self.absmax_scale is not None)

    def stored(self) -> CodebookTensor:
        return CodebookTensor(self.packed, self.absmax, self.absmax_scale, self.absmax_offset, self.shape,
                              self.codebook, self.block)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(lut4_matmul, matmul_op)(x, self.packed, self.absmax, self.absmax_scale, self.absmax_offset,
                                              self.table, self.dmap, self.block)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        return traced(lut4_dequantize, dequantize_op)(self.packed, self.absmax, self.absmax_scale, self.absmax_offset,
                                                      self.codebook, self.block, self.shape[1], row0, row1, dtype)
