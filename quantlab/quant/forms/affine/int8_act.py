"""Integer weights times int8 activations on CPU (W8A8, W4A8): ``int8_act_cpu``, the integer product of
``native/int8_act.c``.

A weight format with ``activations: int8`` rounds each input to int8 per token (or with a static per-tensor scale)
before its product. Emulated, that is a float matmul of the rounded input; this kernel instead rounds the input in
C and multiplies the int8 codes by the weight's 8- or 4-bit codes in int32, one scale product per group, as vLLM's
W8A8 int8 and ggml's Q4_0 x Q8_0 products do. It is chosen only for those formats (``Kernel.rounded_inputs``),
for decode steps (up to ``max_fused_rows`` rows); longer inputs round in torch and use the dense matmul on rows
dequantized in C. Both give the emulation's numbers up to the order of float sums: the integer sums are exact.
"""
from __future__ import annotations

import ctypes
import functools
from typing import ClassVar

import torch
from torch import nn

from .... import native
from ....native.ops import native_op, register_fake
from ...activations import round_activations
from ...kernels.base import KERNELS, FusedRowsKernel, linear_in_row_blocks, traced
from ...tensors.primitives import pack
from .bitplane import SCALE_KINDS
from .tensor import QuantizedTensor

BLOCK = 32  # input widths and group sizes are multiples of it


@functools.cache
def library() -> ctypes.CDLL:
    """The built ``int8_act`` library."""
    lib = native.load("int8_act")
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.int8_act_matmul.argtypes = [p, p, i, p, i, p, f, f, p, i, i, i, i, i]
    lib.int8_act_dequantize.argtypes = [p, p, i, p, i, p, i, i, i, i, i]
    lib.int8_act_matmul.restype = lib.int8_act_dequantize.restype = None
    return lib


def to_q4_0_order(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[out, in]`` packed as ggml's Q4_0 blocks: per 32 codes, 16 bytes, code j in the low nibble of
    byte j and code j + 16 in its high nibble."""
    out, n_in = codes.shape
    c = codes.to(torch.uint8).reshape(out, n_in // BLOCK, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(out, n_in // 2).contiguous()


def from_q4_0_order(packed: torch.Tensor, n_in: int) -> torch.Tensor:
    """Inverse of ``to_q4_0_order``: uint8 codes ``[out, n_in]``."""
    b = packed.reshape(packed.shape[0], n_in // BLOCK, 1, 16)
    return torch.cat([b & 15, b >> 4], dim=2).reshape(packed.shape[0], n_in)


def _zeros(zeros: torch.Tensor | None) -> tuple[int | None, int]:
    return (None, 0) if zeros is None else (zeros.data_ptr(), zeros.shape[1])


def int8_act_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    static_scale: torch.Tensor | None, divisor: float, bits: int, group: int) -> torch.Tensor:
    """``x [M, in]`` (float32) rounded to int8 per row (its max ``|x|`` over ``divisor``) or by ``static_scale
    [1]``, times the weight, transposed: ``[M, out]`` float32."""
    x = x.contiguous()
    m, n_in = x.shape
    y = torch.empty(m, codes.shape[0], dtype=torch.float32)
    static = float(static_scale) if static_scale is not None else 0.0
    library().int8_act_matmul(codes.data_ptr(), scales.data_ptr(), SCALE_KINDS[scales.dtype], *_zeros(zeros),
                              x.data_ptr(), static, divisor, y.data_ptr(), m, codes.shape[0], n_in, bits, group)
    return y


def int8_act_dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int, group: int,
                        n_in: int, row0: int, row1: int) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the weight, float32."""
    out = torch.empty(row1 - row0, n_in, dtype=torch.float32)
    library().int8_act_dequantize(codes.data_ptr(), scales.data_ptr(), SCALE_KINDS[scales.dtype], *_zeros(zeros),
                                  out.data_ptr(), row0, row1, n_in, bits, group)
    return out


matmul_op = native_op("int8_act_matmul", int8_act_matmul)
dequantize_op = native_op("int8_act_dequantize", int8_act_dequantize)


@register_fake(matmul_op)
def _(x, codes, scales, zeros, static_scale, divisor, bits, group):
    return x.new_empty(x.shape[0], codes.shape[0], dtype=torch.float32)


@register_fake(dequantize_op)
def _(codes, scales, zeros, bits, group, n_in, row0, row1):
    return codes.new_empty(row1 - row0, n_in, dtype=torch.float32)


@KERNELS.register
class Int8ActivationKernel(FusedRowsKernel):
    """8-bit codes (signed, code - 128) or 4-bit codes in Q4_0 order, with the stored form's scales and packed zero
    points as they are, multiplied by int8 activations in int32 (``native/int8_act.c``)."""

    path = "int8_act_cpu"
    preference = 15  # ahead of every weight-only CPU path, for the formats that round inputs to int8
    tensor_type: ClassVar[type] = QuantizedTensor
    rounded_inputs: ClassVar[frozenset[str]] = frozenset({"int8"})

    def __init__(self, q: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        library()  # build (or find) the C kernel now: a failure passes the choice on
        native.load_ops("int8_act")  # and its ops' C++ kernels, where they build
        self.shape, self.bits, self.group_size = q.shape, q.bits, q.group_size
        self.group = q.group_size or q.shape[1]
        codes = q.codes()
        self.register_buffer("codes", (codes.to(torch.int16) - 128).to(torch.int8).view(torch.uint8).contiguous()
                             if q.bits == 8 else to_q4_0_order(codes))
        self.register_buffer("scales", q.scales.contiguous())
        self.register_buffer("zeros", None if q.symmetric else q.zeros.contiguous())

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        group = q.group_size or q.shape[1]
        return (device.type == "cpu" and q.bits in (4, 8) and not q.per_tensor and q.g_idx is None
                and q.scales.dtype in SCALE_KINDS and q.shape[1] % BLOCK == 0 and group % BLOCK == 0
                and q.shape[1] % group == 0)

    def analytic_nbytes(self) -> int:
        return QuantizedTensor.analytic_nbytes(self.shape, self.bits, self.group_size, self.zeros is None,
                                               self.scales.element_size(), False, False)

    def stored(self) -> QuantizedTensor:
        n_in = self.shape[1]
        codes = ((self.codes.view(torch.int8).to(torch.int16) + 128).to(torch.uint8) if self.bits == 8
                 else from_q4_0_order(self.codes, n_in))
        return QuantizedTensor(pack(codes, self.bits), self.scales, self.zeros, self.shape, self.bits, self.group_size)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.stored().dequantize(dtype)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        rows = traced(int8_act_dequantize, dequantize_op)(self.codes, self.scales, self.zeros, self.bits, self.group,
                                                          self.shape[1], row0, row1)
        return rows.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The weight-only product (a calibration pass that observes unrounded inputs): the dense matmul."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.shape[1]).float()
        y = linear_in_row_blocks(x2, lambda start, stop: self.rows(start, stop, torch.float32), self.shape,
                                 self.cpu_block_elements)
        return y.reshape(*lead, -1).to(x.dtype)

    def rounded_matmul(self, x: torch.Tensor, rounding: nn.Module) -> torch.Tensor | None:
        if getattr(rounding, "fmt", None) not in self.rounded_inputs or not rounding.rounds_now:
            return None
        static = rounding.input_global_scale if getattr(rounding, "static", False) else None
        divisor = getattr(rounding, "scale_divisor", None) or 127.0
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.shape[1]).float()
        if x2.shape[0] <= self.max_fused_rows:
            y = traced(int8_act_matmul, matmul_op)(x2, self.codes, self.scales, self.zeros, static, divisor,
                                                   self.bits, self.group)
        else:
            xr = round_activations(x2, "int8", global_scale=static, scale_divisor=divisor)
            y = linear_in_row_blocks(xr, lambda start, stop: self.rows(start, stop, torch.float32), self.shape,
                                     self.cpu_block_elements)
        return y.reshape(*lead, -1).to(x.dtype)

