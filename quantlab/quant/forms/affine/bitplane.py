"""Integer weights of any width (1-8 bits) on CPU: codes in bit planes, multiplied by a fused C kernel.

torch has CPU kernels for 4- and 8-bit weights only; other widths (and 4-bit with float32 activations, 8-bit in
groups) would otherwise unpack and dequantize the whole weight for every matmul. Here the codes are re-laid at
quantization time into bit planes (``native/bitplane.c``: 32 codes per block of ``4 * bits`` bytes, the same
bytes as the packed format), and a decode step's few rows of activations are multiplied by them directly: the
codes are decoded in registers, a group at a time, and never written out (with a bf16 model's activations, every
value a bfloat16, and AVX512-BF16 with VBMI: as the bfloat16 values 1 + code / 2^bits, exact, in bfloat16 dot
products, the 1s taken out again with the group's sum of the activations). Longer inputs (prefill, perplexity
windows) dequantize a block of rows at a time in C and use the dense matmul, which is faster once the weight
is reused by enough rows. Both are registered torch ops, so the path also runs inside ``torch.compile``.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from .... import native
from ....native.ops import native_op, register_fake
from ...kernels.base import KERNELS, OUT_KINDS, FusedRowsKernel, bf16_or_float32, traced
from ...tensors.primitives import pack
from .float_zero import FloatZeroTensor
from .tensor import QuantizedTensor, act_order_columns, group_index

BLOCK = 32  # codes per block: input widths and group sizes must be multiples of it
SCALE_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def to_bitplanes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``codes`` uint8 ``[out, in]`` (``in`` a multiple of 32) as bit planes: ``[out, in * bits / 8]`` uint8."""
    out, n_in = codes.shape
    c = codes.to(torch.int32).reshape(out, n_in // BLOCK, 4, 8)  # [row, block, i, t] holds code 8i + t
    planes = []
    for p in range(bits // 2):  # two bits of code 8i+t at bits 2i, 2i+1 of byte t
        two = (c >> (2 * p)) & 3
        planes.append((two << (2 * torch.arange(4, dtype=torch.int32)).view(4, 1)).sum(2))
    if bits % 2:  # the top bit of code 8i+t at bit t of byte i
        planes.append((((c >> (bits - 1)) & 1) << torch.arange(8, dtype=torch.int32)).sum(3))
    return torch.cat(planes, dim=-1).to(torch.uint8).reshape(out, -1).contiguous()


def from_bitplanes(planes: torch.Tensor, bits: int, n_in: int) -> torch.Tensor:
    """Inverse of ``to_bitplanes``: uint8 codes ``[out, n_in]``."""
    out = planes.shape[0]
    b = planes.reshape(out, n_in // BLOCK, 4 * bits).to(torch.int32)
    codes = torch.zeros(out, n_in // BLOCK, 4, 8, dtype=torch.int32)
    for p in range(bits // 2):
        plane = b[..., 8 * p: 8 * p + 8].unsqueeze(2)  # [row, block, 1, t]
        codes |= ((plane >> (2 * torch.arange(4, dtype=torch.int32)).view(4, 1)) & 3) << (2 * p)
    if bits % 2:
        top = b[..., 8 * (bits // 2): 8 * (bits // 2) + 4].unsqueeze(3)  # [row, block, i, 1]
        codes |= ((top >> torch.arange(8, dtype=torch.int32)) & 1) << (bits - 1)
    return codes.reshape(out, n_in).to(torch.uint8)


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The built ``bitplane`` library (``flags``: extra compiler options, ``native.load``)."""
    lib = native.load("bitplane", flags)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.bitplane_matmul.argtypes = lib.bitplane_matmul_bf16.argtypes = [p, p, i, p, i, i, p, p, i, i, i, i, i]
    lib.bitplane_dequantize.argtypes = [p, p, i, p, i, i, p, i, i, i, i, i, i]
    lib.bitplane_matmul.restype = lib.bitplane_dequantize.restype = None
    lib.bitplane_matmul_bf16.restype = i
    return lib


def _zeros(zeros: torch.Tensor | None) -> tuple[int | None, int]:
    """The zero points' address and bytes per row when packed as codes (uint8), -1 when they are float zero points
    stored like the scales (HQQ's form); none: symmetric."""
    if zeros is None:
        return None, 0
    return zeros.data_ptr(), zeros.shape[1] if zeros.dtype == torch.uint8 else -1


def bitplane_matmul(x: torch.Tensor, planes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    bits: int, group: int) -> torch.Tensor:
    """``x [M, in]`` (float32, or bfloat16 as a bf16 model's activations are) times the bit-plane weight
    ``[out, in]``, transposed: ``[M, out]`` float32."""
    x = bf16_or_float32(x)
    m, n_in = x.shape
    y = torch.empty(m, planes.shape[0], dtype=torch.float32)
    lib = library()
    product = lib.bitplane_matmul_bf16 if x.dtype == torch.bfloat16 else lib.bitplane_matmul
    if product(planes.data_ptr(), scales.data_ptr(), SCALE_KINDS[scales.dtype], *_zeros(zeros), 1 << (bits - 1),
               x.data_ptr(), y.data_ptr(), m, planes.shape[0], n_in, bits, group):
        raise MemoryError("bitplane_matmul: out of memory")
    return y


def bitplane_dequantize(planes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int,
                        group: int, n_in: int, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[row0, row1)`` of the weight as ``dtype`` (float32 or bfloat16)."""
    out = torch.empty(row1 - row0, n_in, dtype=dtype)
    library().bitplane_dequantize(planes.data_ptr(), scales.data_ptr(), SCALE_KINDS[scales.dtype], *_zeros(zeros),
                                   1 << (bits - 1), out.data_ptr(), OUT_KINDS[dtype], row0, row1, n_in, bits, group)
    return out


# The same functions as torch ops, for torch.compile.
matmul_op = native_op("bitplane_matmul", bitplane_matmul)
dequantize_op = native_op("bitplane_dequantize", bitplane_dequantize)


@register_fake(matmul_op)
def _(x, planes, scales, zeros, bits, group):
    return x.new_empty(x.shape[0], planes.shape[0], dtype=torch.float32)


@register_fake(dequantize_op)
def _(planes, scales, zeros, bits, group, n_in, row0, row1, dtype):
    return planes.new_empty(row1 - row0, n_in, dtype=dtype)


@KERNELS.register
class BitplaneCPUKernel(FusedRowsKernel):
    """Codes of any width in bit planes, with the packed format's scales and zero points as they are (integer codes
    packed, or HQQ's float zero points), so the bytes held are the format's; fused C matmul for decode steps."""

    path = "bitplane_cpu"
    preference = 50
    fused_dtypes = (torch.float32, torch.bfloat16)
    tensor_type = (QuantizedTensor, FloatZeroTensor)

    def __init__(self, q: QuantizedTensor | FloatZeroTensor, dtype: torch.dtype) -> None:
        super().__init__()
        library()  # build (or find) the C kernel now: a failure passes the choice on
        native.load_ops("bitplane")  # and its ops' C++ kernels, where they build
        self.shape, self.bits, self.group_size = q.shape, q.bits, q.group_size
        self.group = q.group_size or q.shape[1]
        self.float_zero = isinstance(q, FloatZeroTensor)
        order = None if self.float_zero else act_order_columns(q)
        codes = q.codes() if order is None else q.codes()[:, order.long()]
        self.register_buffer("planes", to_bitplanes(codes, q.bits))
        self.register_buffer("scales", q.scales.contiguous())
        keep_zeros = self.float_zero or not q.symmetric
        self.register_buffer("zeros", q.zeros.to(q.scales.dtype if self.float_zero else q.zeros.dtype).contiguous()
                             if keep_zeros else None)
        self.register_buffer("column_order", order)

    @classmethod
    def supports(cls, q: QuantizedTensor | FloatZeroTensor, device: torch.device, dtype: torch.dtype) -> bool:
        group = q.group_size or q.shape[1]
        float_zero = isinstance(q, FloatZeroTensor)
        return (device.type == "cpu" and dtype in OUT_KINDS and q.scales.dtype in SCALE_KINDS
                and (float_zero and q.zeros.dtype == q.scales.dtype or not float_zero and not q.per_tensor)
                and q.shape[1] % BLOCK == 0 and group % BLOCK == 0)

    def analytic_nbytes(self) -> int:
        """The packed format's formula: the planes take the packed codes' bytes, the column order g_idx's."""
        if self.float_zero:
            return FloatZeroTensor.analytic_nbytes(self.shape, self.bits, self.group_size, self.scales.element_size())
        return QuantizedTensor.analytic_nbytes(self.shape, self.bits, self.group_size, self.zeros is None,
                                               self.scales.element_size(), self.column_order is not None)

    def stored(self) -> QuantizedTensor | FloatZeroTensor:
        codes = from_bitplanes(self.planes.cpu(), self.bits, self.shape[1]).to(self.planes.device)
        if self.column_order is not None:  # back from group-sorted to the input's column order
            codes = codes[:, torch.argsort(self.column_order.long())]
        packed = pack(codes, self.bits)
        if self.float_zero:
            return FloatZeroTensor(packed, self.scales, self.zeros, self.shape, self.bits, self.group_size)
        return QuantizedTensor(packed, self.scales, self.zeros, self.shape, self.bits, self.group_size,
                               group_index(self.column_order, self.group))

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        return traced(bitplane_matmul, matmul_op)(x, self.planes, self.scales, self.zeros, self.bits, self.group)

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows of the weight with its columns in stored (act-order sorted) order."""
        return traced(bitplane_dequantize, dequantize_op)(self.planes, self.scales, self.zeros, self.bits, self.group,
                                                          self.shape[1], row0, row1, dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = self.rows(0, self.shape[0], torch.float32)
        if self.column_order is not None:
            w = w[:, torch.argsort(self.column_order.long())]
        return w.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.column_order is not None:
            x = x.index_select(-1, self.column_order)
        return super().forward(x)
