"""FP8 weights: on CPU the stored bytes multiplied directly (``fp8_cpu``, a C kernel: each code widened to a float
in registers, weight-only, the activations untouched); on CUDA through ``torch._scaled_mm`` (compute capability
8.9+), the activations cast to e4m3 per row, the W8A8 form of vLLM's and torchao's float8 rowwise, never chosen
by ``auto``: rounding the activations changes the numerics."""
from __future__ import annotations

import ctypes
import functools
from typing import ClassVar

import torch

from .... import native
from ....native.ops import native_op, register_fake
from ...kernels.base import KERNELS, OUT_KINDS, FusedRowsKernel, Kernel, traced
from .tensor import Float8Tensor

KINDS = {"float8_e4m3fn": 0, "float8_e5m2": 1}  # torch dtype name -> the C kernel's code


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The built ``fp8`` library (``flags``: extra compiler options, ``native.load``)."""
    lib = native.load("fp8", flags)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.fp8_matmul.argtypes = [p, p, i, i, p, p, i, i, i]
    lib.fp8_dequantize.argtypes = [p, p, i, i, p, i, i, i, i]
    lib.fp8_blocks_matmul.argtypes = [p, p, i, i, i, p, p, i, i, i]
    lib.fp8_blocks_dequantize.argtypes = [p, p, i, i, i, p, i, i, i, i]
    lib.fp8_matmul.restype = lib.fp8_dequantize.restype = None
    lib.fp8_blocks_matmul.restype = lib.fp8_blocks_dequantize.restype = None
    return lib


def _kind(data: torch.Tensor) -> int:
    return KINDS[str(data.dtype).removeprefix("torch.")]


def fp8_matmul(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x [M, in]`` (float32) times the float8 weight ``[out, in]`` with its float32 scales, transposed."""
    x = x.contiguous()
    m, n_in = x.shape
    y = torch.empty(m, data.shape[0], dtype=torch.float32)
    library().fp8_matmul(data.data_ptr(), scales.data_ptr(), int(scales.shape[0] == 1), _kind(data), x.data_ptr(),
                          y.data_ptr(), m, data.shape[0], n_in)
    return y


def fp8_dequantize(data: torch.Tensor, scales: torch.Tensor, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the weight as ``dtype`` (float32 or bfloat16)."""
    out = torch.empty(row1 - row0, data.shape[1], dtype=dtype)
    library().fp8_dequantize(data.data_ptr(), scales.data_ptr(), int(scales.shape[0] == 1), _kind(data),
                              out.data_ptr(), OUT_KINDS[dtype], row0, row1, data.shape[1])
    return out


matmul_op = native_op("fp8_matmul", fp8_matmul)
dequantize_op = native_op("fp8_dequantize", fp8_dequantize)


@register_fake(matmul_op)
def _(x, data, scales):
    return x.new_empty(x.shape[0], data.shape[0], dtype=torch.float32)


@register_fake(dequantize_op)
def _(data, scales, row0, row1, dtype):
    return data.new_empty(row1 - row0, data.shape[1], dtype=dtype)


@KERNELS.register
class FP8CPUKernel(FusedRowsKernel):
    """Float8 codes (e4m3fn, e5m2) as stored with their float32 scales; fused C matmul for decode steps (each code
    widened to a float in registers), C dequantization of row blocks for longer inputs."""

    path = "fp8_cpu"
    preference = 60
    tensor_type: ClassVar[type] = Float8Tensor

    @classmethod
    def supports(cls, q: Float8Tensor, device: torch.device, dtype: torch.dtype) -> bool:
        return (device.type == "cpu" and dtype in OUT_KINDS and str(q.data.dtype).removeprefix("torch.") in KINDS
                and q.scales.dtype == torch.float32 and not q.block_size)

    def __init__(self, q: Float8Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        library()  # build (or find) the C kernel now: a failure passes the choice on
        native.load_ops("fp8")  # and its ops' C++ kernels, where they build
        self.shape = q.shape
        self.register_buffer("data", q.data.contiguous())
        self.register_buffer("scales", q.scales.contiguous())

    def analytic_nbytes(self) -> int:
        return Float8Tensor.analytic_nbytes(self.shape, self.scales.shape[0] == 1 and self.shape[0] > 1)

    def stored(self) -> Float8Tensor:
        return Float8Tensor(self.data, self.scales, self.shape)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(fp8_matmul, matmul_op)(x, self.data, self.scales)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        return traced(fp8_dequantize, dequantize_op)(self.data, self.scales, row0, row1, dtype)


BLOCK_SCALE_KINDS = {torch.float32: 0, torch.uint8: 1}  # native/fp8.c: float32 scales, or e8m0 exponent bytes


def fp8_blocks_matmul(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, block: int,
                      rows_per_scale: int) -> torch.Tensor:
    """``x [M, in]`` (float32) times a blocked e4m3 weight ``[out, in]`` (bytes), transposed: one scale (float32, or
    an e8m0 byte) per ``block`` inputs of ``rows_per_scale`` rows (MXFP8: 32 and 1; block FP8: b and b)."""
    x = x.contiguous()
    m, n_in = x.shape
    y = torch.empty(m, data.shape[0], dtype=torch.float32)
    library().fp8_blocks_matmul(data.data_ptr(), scales.data_ptr(), BLOCK_SCALE_KINDS[scales.dtype], block,
                                rows_per_scale, x.data_ptr(), y.data_ptr(), m, data.shape[0], n_in)
    return y


def fp8_blocks_dequantize(data: torch.Tensor, scales: torch.Tensor, block: int, rows_per_scale: int, row0: int,
                          row1: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of a blocked e4m3 weight as ``dtype`` (float32 or bfloat16)."""
    out = torch.empty(row1 - row0, data.shape[1], dtype=dtype)
    library().fp8_blocks_dequantize(data.data_ptr(), scales.data_ptr(), BLOCK_SCALE_KINDS[scales.dtype], block,
                                    rows_per_scale, out.data_ptr(), OUT_KINDS[dtype], row0, row1, data.shape[1])
    return out


blocks_matmul_op = native_op("fp8_blocks_matmul", fp8_blocks_matmul)
blocks_dequantize_op = native_op("fp8_blocks_dequantize", fp8_blocks_dequantize)


@register_fake(blocks_matmul_op)
def _(x, data, scales, block, rows_per_scale):
    return x.new_empty(x.shape[0], data.shape[0], dtype=torch.float32)


@register_fake(blocks_dequantize_op)
def _(data, scales, block, rows_per_scale, row0, row1, dtype):
    return data.new_empty(row1 - row0, data.shape[1], dtype=dtype)


class BlockedFP8Kernel(FusedRowsKernel):
    """Blocked e4m3 codes (bytes in ``data``) with their scales, multiplied as stored: fused C matmul for decode
    steps (codes widened in registers, each block's partial sum scaled once), C dequantization of row blocks for
    longer inputs. Subclasses hold ``data``, ``scales``, ``block`` and ``rows_per_scale``."""

    block: int
    rows_per_scale: int

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(fp8_blocks_matmul, blocks_matmul_op)(x, self.data, self.scales, self.block, self.rows_per_scale)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        return traced(fp8_blocks_dequantize, blocks_dequantize_op)(self.data, self.scales, self.block,
                                                                   self.rows_per_scale, row0, row1, dtype)


@KERNELS.register
class FP8BlockCPUKernel(BlockedFP8Kernel):
    """Block-scaled e4m3 codes (a float32 scale per square tile) as stored."""

    path = "fp8_block_cpu"
    preference = 62
    tensor_type: ClassVar[type] = Float8Tensor

    @classmethod
    def supports(cls, q: Float8Tensor, device: torch.device, dtype: torch.dtype) -> bool:
        return (device.type == "cpu" and dtype in OUT_KINDS and bool(q.block_size) and q.shape[1] % 16 == 0
                and q.block_size % 16 == 0 and q.data.dtype == torch.float8_e4m3fn and q.scales.dtype == torch.float32)

    def __init__(self, q: Float8Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        library()  # build (or find) the C kernel now: a failure passes the choice on
        native.load_ops("fp8")  # and its ops' C++ kernels, where they build
        self.shape, self.block, self.rows_per_scale = q.shape, q.block_size, q.block_size
        self.register_buffer("data", q.data.contiguous().view(torch.uint8))
        self.register_buffer("scales", q.scales.contiguous())

    def analytic_nbytes(self) -> int:
        return Float8Tensor.analytic_nbytes(self.shape, False, self.block)

    def stored(self) -> Float8Tensor:
        return Float8Tensor(self.data.view(torch.float8_e4m3fn), self.scales, self.shape, self.block)


@KERNELS.register
class FP8ScaledMMKernel(Kernel):
    """``torch._scaled_mm`` on e4m3 weights with a scale per output channel (a per-tensor scale is broadcast at
    the call) and bf16 activations cast to e4m3 with a scale per row, the product scaled by both in the matmul."""

    path = "fp8_scaled_mm_cuda"
    preference = 70
    tensor_type: ClassVar[type] = Float8Tensor

    @classmethod
    def in_auto(cls, device: torch.device) -> bool:
        return False

    @classmethod
    def supports(cls, q: Float8Tensor, device: torch.device, dtype: torch.dtype) -> bool:
        return (device.type == "cuda" and hasattr(torch, "_scaled_mm") and dtype == torch.bfloat16
                and torch.cuda.get_device_capability(device) >= (8, 9)
                and q.data.dtype == getattr(torch, "float8_e4m3fn", None)
                and q.shape[0] % 16 == 0 and q.shape[1] % 16 == 0 and not q.block_size)

    def __init__(self, q: Float8Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape = q.shape
        self.register_buffer("data", q.data)  # [out, in] row-major: its transpose is the column-major operand
        self.register_buffer("scales", q.scales.float())

    def analytic_nbytes(self) -> int:
        return Float8Tensor.analytic_nbytes(self.shape, self.scales.shape[0] == 1 and self.shape[0] > 1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.float() * self.scales).to(dtype)

    def stored(self) -> Float8Tensor:
        return Float8Tensor(self.data, self.scales, self.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, n_in = self.shape
        rows = x.reshape(-1, n_in)
        e4m3 = self.data.dtype
        x_scale = (rows.abs().amax(dim=1, keepdim=True).float() / torch.finfo(e4m3).max).clamp(min=1e-12)
        x8 = (rows.float() / x_scale).to(e4m3)
        w_scale = self.scales.reshape(1, -1).expand(1, out).contiguous()
        y = torch._scaled_mm(x8, self.data.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], out)


