"""The microscaling forms on CPU. The e2m1 forms (MXFP4, NVFP4): their codes multiplied as stored through the 16 e2m1 values in registers,
each block's scale decoded in the kernel (an e8m0 exponent byte, or an e4m3 byte over the global scale), so the
bytes held and read are the form's (``native/lut4.c``, shared with the 4-bit codebooks). With a bf16 model's
activations (every value a bfloat16) and AVX512-BF16, a decode row's product is bfloat16 dot products: e2m1's
values are bfloat16 too, so the products are exact and only the float32 sums round. Decode steps' few rows go
through the fused product; longer inputs dequantize a block of rows at a time for the dense matmul. Both are torch
ops, so the path runs inside ``torch.compile``. MXFP8: the fp8 kernels' blocked e4m3 path (codes widened in
registers, each block of 32 scaled by its e8m0 exponent; ``native/fp8.c``), which block FP8 takes too."""
from __future__ import annotations

import functools
from typing import ClassVar

import torch

from .... import native
from ....native.ops import native_op, register_fake
from ...kernels.base import KERNELS, OUT_KINDS, FusedRowsKernel, traced
from ..codebook import kernel as lut4_kernels
from ..float8 import kernel as fp8_kernels
from .tensor import MX_BLOCK, MXTensor, NVFP4Tensor, e2m1_table

SCALE_E8M0, SCALE_E4M3 = 2, 3  # the scale kinds of native/lut4.c


@functools.cache
def _e2m1() -> torch.Tensor:
    return e2m1_table().contiguous()


@functools.cache
def _e4m3() -> torch.Tensor:
    """The 256 e4m3 bytes as float32 (NaN bytes decode to NaN)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().contiguous()


def _scales(global_scale: torch.Tensor | None) -> tuple[int, int | None]:
    return (SCALE_E8M0, None) if global_scale is None else (SCALE_E4M3, global_scale.data_ptr())


def e2m1_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None,
                table: torch.Tensor, e4m3: torch.Tensor, block: int) -> torch.Tensor:
    """``x [M, in]`` (float32, or bfloat16 as a bf16 model's activations are) times the e2m1 weight ``[out, in]``,
    transposed: ``[M, out]`` float32; ``table`` the 16 e2m1 values and ``e4m3`` the 256 e4m3 bytes' (float32).
    ``lut4_ops.cpp`` is the same call in C++."""
    kind, gs = _scales(global_scale)
    return lut4_kernels.lut4_product(x, codes, (scales.data_ptr(), kind, gs, None), e4m3, table, block)


def e2m1_dequantize(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None, block: int,
                    row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the weight as ``dtype`` (float32 or bfloat16)."""
    n_in = codes.shape[1] * 2
    out = torch.empty(row1 - row0, n_in, dtype=dtype)
    kind, gs = _scales(global_scale)
    lut4_kernels.library().lut4_dequantize(codes.data_ptr(), scales.data_ptr(), kind, gs, None, _e4m3().data_ptr(),
                              _e2m1().data_ptr(), out.data_ptr(), OUT_KINDS[dtype], row0, row1, n_in, block)
    return out


matmul_op = native_op("e2m1_matmul", e2m1_matmul)
dequantize_op = native_op("e2m1_dequantize", e2m1_dequantize)


@register_fake(matmul_op)
def _(x, codes, scales, global_scale, table, e4m3, block):
    return x.new_empty(x.shape[0], codes.shape[0], dtype=torch.float32)


@register_fake(dequantize_op)
def _(codes, scales, global_scale, block, row0, row1, dtype):
    return codes.new_empty(row1 - row0, codes.shape[1] * 2, dtype=dtype)


@KERNELS.register
class E2M1CPUKernel(FusedRowsKernel):
    """MXFP4 or NVFP4 codes and scales as stored; fused C matmul through the e2m1 table for decode steps, C
    dequantization of row blocks for longer inputs."""

    path = "e2m1_lut_cpu"
    preference = 56
    fused_dtypes = (torch.float32, torch.bfloat16)  # a bf16 model's activations take the bfloat16 dot products
    tensor_type: ClassVar[tuple[type, ...]] = (MXTensor, NVFP4Tensor)

    def __init__(self, q: MXTensor | NVFP4Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        lut4_kernels.library()  # build (or find) the C kernel now: a failure passes the choice on
        native.load_ops("lut4")  # and its ops' C++ kernels (e2m1_matmul's among them), where they build
        self.shape, self.block, self._form = q.shape, q.group_size, type(q)
        self.table, self.e4m3 = _e2m1(), _e4m3()  # constants shared by every weight, not buffers
        self.register_buffer("codes", q.codes.contiguous())
        self.register_buffer("scales", q.scales.contiguous().view(torch.uint8))
        self.register_buffer("global_scale", getattr(q, "global_scale", None))

    @classmethod
    def supports(cls, q: MXTensor | NVFP4Tensor, device: torch.device, dtype: torch.dtype) -> bool:
        e2m1 = isinstance(q, NVFP4Tensor) or getattr(q, "element", None) == "e2m1"
        return device.type == "cpu" and dtype in OUT_KINDS and e2m1 and q.shape[1] % 32 == 0

    def stored(self) -> MXTensor | NVFP4Tensor:
        if self._form is NVFP4Tensor:
            return NVFP4Tensor(self.codes, self.scales.view(torch.float8_e4m3fn), self.global_scale, self.shape)
        return MXTensor(self.codes, self.scales, self.shape, "e2m1")

    def analytic_nbytes(self) -> int:
        return self.stored().layout_nbytes()

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(e2m1_matmul, matmul_op)(x, self.codes, self.scales, self.global_scale, self.table, self.e4m3,
                                              self.block)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        return traced(e2m1_dequantize, dequantize_op)(self.codes, self.scales, self.global_scale, self.block, row0,
                                                      row1, dtype)


@KERNELS.register
class MXFP8CPUKernel(fp8_kernels.BlockedFP8Kernel):
    """MXFP8 codes and e8m0 scales as stored, through the fp8 kernels' blocked path (blocks of 32, one row each)."""

    path = "mxfp8_cpu"
    preference = 61
    tensor_type: ClassVar[type] = MXTensor

    def __init__(self, q: MXTensor, dtype: torch.dtype) -> None:
        super().__init__()
        fp8_kernels.library()  # build (or find) the C kernel now: a failure passes the choice on
        self.shape, self.block, self.rows_per_scale = q.shape, MX_BLOCK, 1
        self.register_buffer("data", q.codes.contiguous().view(torch.uint8))
        self.register_buffer("scales", q.scales.contiguous())

    @classmethod
    def supports(cls, q: MXTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype in OUT_KINDS and q.element == "e4m3" and q.shape[1] % MX_BLOCK == 0

    def stored(self) -> MXTensor:
        return MXTensor(self.data.view(torch.float8_e4m3fn), self.scales, self.shape, "e4m3")

    def analytic_nbytes(self) -> int:
        return MXTensor.analytic_nbytes(self.shape, "e4m3")
