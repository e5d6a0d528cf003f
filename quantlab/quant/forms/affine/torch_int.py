"""torch's own weight-only kernels: int4 tinygemm (CUDA), the int4 CPU kernel, and int8 (cast inside the matmul
on CUDA, ``_weight_int8pack_mm`` elsewhere)."""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from ....errors import UnsupportedError
from ...kernels.base import KERNELS, Kernel, fused_row_matmul, linear_in_row_blocks, use_fused_row_matmul
from ...tensors.primitives import pack
from . import int4pack
from .float_zero import FloatZeroTensor
from .tensor import QuantizedTensor, act_order_columns, group_index

INT4_GROUPS = (32, 64, 128, 256)


def _int4_scales_and_zeros(q: QuantizedTensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """``[in/group, out, 2]`` with ``(code - 8) * scale + zero == (code - z) * scale``."""
    scale = q.row_scales().float()
    zero = (8.0 - q.row_zero_points().float()) * scale
    if q.group_size is None:  # per channel: repeat the row's parameters for every group
        n = q.shape[1] // group
        scale, zero = scale.expand(-1, n), zero.expand(-1, n)
    return torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()


def _int4_group(q: QuantizedTensor) -> int | None:
    """The kernel group size: the tensor's own, or for one scale per row the largest that divides the input."""
    if q.group_size is not None:
        return q.group_size if q.group_size in INT4_GROUPS and _int4_tail(q) is not None else None
    return next((g for g in reversed(INT4_GROUPS) if q.shape[1] % g == 0), None)


def _int4_tail(q: QuantizedTensor) -> int | None:
    """Width of a short last group the kernels take as a second matmul of its own (0: the group size divides
    the input), or None when they cannot (a tail that is not itself a kernel group, or act-order columns).
    SmolLM2's 576-wide inputs with groups of 128 end in a group of 64."""
    if q.group_size is None:
        return 0
    tail = q.shape[1] % q.group_size
    if tail == 0:
        return 0
    return tail if tail in INT4_GROUPS and q.g_idx is None else None


class Int4Kernel(Kernel):
    """Shared layout of torch's int4 kernels: codes in a kernel-specific packing + per-group (scale, zero).

    A short last group (an input width the group size does not divide) is a second, narrow matmul with its own
    packing and group size, added to the first: no padding, no extra bytes. Float zero points (``zero_point:
    float``, HQQ) fit the kernels' ``(code - 8) * scale + zero`` form exactly, so those tensors run here too."""

    tensor_type = (QuantizedTensor, FloatZeroTensor)

    def __init__(self, q: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape, self.group, self.tail = q.shape, _int4_group(q), _int4_tail(q) or 0
        self.group_size, self.float_zero = q.group_size, isinstance(q, FloatZeroTensor)
        self.symmetric = not self.float_zero and q.symmetric  # its zero point is 8 everywhere: stored() says so
        order = act_order_columns(q)
        codes = q.codes() if order is None else q.codes()[:, order.long()]
        sz = _int4_scales_and_zeros(q, self.group, dtype)
        head = q.shape[1] - self.tail
        self.register_buffer("packed", self._pack(codes[:, :head].contiguous(), head))
        self.register_buffer("scales_and_zeros", sz[: head // self.group].contiguous())
        self.register_buffer("tail_packed", self._pack(codes[:, head:].contiguous(), self.tail) if self.tail else None)
        self.register_buffer("tail_scales_and_zeros", sz[head // self.group:].contiguous() if self.tail else None)
        self.register_buffer("column_order", order)
        self._packed_codes(codes)

    def _packed_codes(self, codes: torch.Tensor) -> None:
        """Called with the codes ``[out, in]`` (kernel column order) once they are packed."""

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return q.bits == 4 and _int4_group(q) is not None

    def analytic_nbytes(self) -> int:
        out, n_in = self.shape
        order = 4 * n_in if self.column_order is not None else 0
        groups = (n_in - self.tail) // self.group + (1 if self.tail else 0)
        return out * n_in // 2 + groups * out * 2 * self.scales_and_zeros.element_size() + order

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        eye = torch.eye(self.shape[1], dtype=self.scales_and_zeros.dtype, device=self.packed.device)
        w = self._matmul_all(eye).t()  # columns in kernel order
        if self.column_order is not None:
            w = w[:, torch.argsort(self.column_order.long())]
        return w.to(dtype)

    def stored(self) -> QuantizedTensor | FloatZeroTensor:
        """The tensor as this kernel holds it: the codes read back from torch's packing (``_unpack_codes``), the
        kernel's own scales and zero points (in the activation dtype), so it is the one measured."""
        out, n_in = self.shape
        sz = self.scales_and_zeros if not self.tail else torch.cat([self.scales_and_zeros, self.tail_scales_and_zeros])
        scale, zero = sz[..., 0].t().float(), sz[..., 1].t().float()  # [out, G], kernel column order
        head = n_in - self.tail
        codes = self._unpack_codes(self.packed, head, self.group, self.scales_and_zeros)
        if self.tail:
            codes = torch.cat([codes, self._unpack_codes(self.tail_packed, self.tail, self.tail,
                                                         self.tail_scales_and_zeros)], dim=1)
        g_idx = group_index(self.column_order, self.group)
        if self.column_order is not None:
            codes = codes[:, torch.argsort(self.column_order.long())]
        if self.group_size is None:  # per channel: the kernel repeated the row's parameters in every group
            scale, zero = scale[:, :1], zero[:, :1]
        zero_points = 8.0 - zero / scale  # (code - 8) * s + zero == (code - z) * s
        if self.float_zero:
            return FloatZeroTensor(pack(codes, 4), scale.to(sz.dtype), zero_points.to(sz.dtype), self.shape, 4,
                                   self.group_size)
        zeros = torch.round(zero_points).clamp(0, 15).to(torch.uint8)
        if getattr(self, "symmetric", False) and bool((zeros == 8).all()):  # a symmetric tensor stays symmetric
            return QuantizedTensor(pack(codes, 4), scale.to(sz.dtype), None, self.shape, 4, self.group_size, g_idx)
        return QuantizedTensor(pack(codes, 4), scale.to(sz.dtype), pack(zeros, 4), self.shape, 4, self.group_size, g_idx)

    def _unpack_codes(self, packed: torch.Tensor, width: int, group: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
        """Codes ``[out, width]`` read through the kernel (torch's packing is not documented): identity rows
        multiply out to ``(code - 8) * scale + zero``, which rounds back to the code (the activation dtype's
        error is a few hundredths of a step). Checked by packing the codes again: the same bytes."""
        scale, zero = scales_and_zeros[..., 0].t().float(), scales_and_zeros[..., 1].t().float()
        scale, zero = scale.repeat_interleave(group, dim=1), zero.repeat_interleave(group, dim=1)
        eye = torch.eye(width, dtype=scales_and_zeros.dtype, device=packed.device)
        step = max(1, (1 << 22) // max(self.shape[0], 1))
        w = torch.cat([self._matmul(eye[k:k + step], packed, group, scales_and_zeros)
                       for k in range(0, width, step)]).t().float()
        codes = torch.round((w - zero) / scale + 8).clamp(0, 15).to(torch.uint8)
        if not torch.equal(self._pack(codes.to(torch.int32), width), packed):
            raise UnsupportedError(f"{self.path}: its packed codes could not be read back exactly")
        return codes

    def _matmul_all(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tail:
            return self._matmul(x, self.packed, self.group, self.scales_and_zeros)
        head = self.shape[1] - self.tail
        return (self._matmul(x[:, :head].contiguous(), self.packed, self.group, self.scales_and_zeros)
                + self._matmul(x[:, head:].contiguous(), self.tail_packed, self.tail, self.tail_scales_and_zeros))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.column_order is not None:
            x = x.index_select(-1, self.column_order)
        lead = x.shape[:-1]
        y = self._matmul_all(x.reshape(-1, x.shape[-1]).to(self.scales_and_zeros.dtype))
        return y.reshape(*lead, -1).to(x.dtype)


@KERNELS.register
class Int4CPUKernel(Int4Kernel):
    """torch's ``_weight_int4pack_mm_for_cpu`` for a decode step's few rows; for more (a prompt, a perplexity
    window) the weight dequantized from the same packed bytes a block of output rows at a time (``int4pack``)
    and the dense bf16 matmul: torch's kernel decodes every weight again for each four rows of the input (128
    rows of a 2048x640 weight, 2 cores: 1.53 ms against 0.46 for the dense matmul)."""

    path = "int4pack_mm_cpu"
    preference = 20
    max_fused_rows: ClassVar[int] = 32  # rows up to which torch's kernel is as fast as read-back+matmul (2 cores)
    cpu_block_elements: ClassVar[int] = 1 << 19  # dense elements per block of rows for longer inputs

    layout: int | None  # how torch packed the codes (``int4pack``); None: every input through torch's kernel

    def _packed_codes(self, codes: torch.Tensor) -> None:
        self.layout = int4pack.checked_layout(codes, self.packed, self.scales_and_zeros, self.group,
                                              self.tail_packed, self.tail_scales_and_zeros, self.tail)

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        # Fast for bfloat16 activations only: with float32 ones it is slower than the dense fp32 matmul.
        return (device.type == "cpu" and dtype == torch.bfloat16 and hasattr(torch, "_weight_int4pack_mm_for_cpu")
                and super().supports(q, device, dtype))

    def _pack(self, codes: torch.Tensor, width: int) -> torch.Tensor:
        return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)

    def _matmul(self, x: torch.Tensor, packed: torch.Tensor, group: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)

    def rows_t(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        """Output rows ``[row0, row1)`` of the weight as ``dtype`` (float32 or bfloat16), transposed (``[in, rows]``),
        columns in kernel order."""
        head = int4pack.rows_t(self.packed, self.scales_and_zeros, self.group, self.layout, row0, row1, dtype)
        if not self.tail:
            return head
        tail = int4pack.rows_t(self.tail_packed, self.tail_scales_and_zeros, self.tail, self.layout, row0, row1, dtype)
        return torch.cat([head, tail])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] <= self.max_fused_rows or self.layout is None:
            return super().forward(x)
        if self.column_order is not None:
            x2 = x2.index_select(-1, self.column_order)
        x2, (out, n_in) = x2.to(self.scales_and_zeros.dtype), self.shape
        block = max(64, self.cpu_block_elements // n_in // 64 * 64)  # whole blocks of torch's packing
        y = torch.cat([torch.mm(x2, self.rows_t(r, min(r + block, out), x2.dtype)) for r in range(0, out, block)],
                      dim=-1)
        return y.reshape(*x.shape[:-1], -1).to(x.dtype)


def tinygemm_inner_k_tiles(out_features: int, in_features: int) -> int | None:
    """How many 16-wide k-tiles tinygemm packs per word row (8, 4 or 2, the widest the input divides into);
    ``None`` for shapes it cannot take (rows in tiles of 8, the input in whole tile groups)."""
    if out_features % 8:
        return None
    return next((tiles for tiles in (8, 4, 2) if in_features % (16 * tiles) == 0), None)


@KERNELS.register
class Int4TinyGemmKernel(Int4Kernel):
    """torch's CUDA ``_weight_int4pack_mm`` (tinygemm), bfloat16 activations."""

    path = "int4_tinygemm_cuda"
    preference = 10

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        if device.type != "cuda" or dtype != torch.bfloat16 or not super().supports(q, device, dtype):
            return False
        tail = _int4_tail(q) or 0
        widths = [q.shape[1] - tail] + ([tail] if tail else [])
        return all(tinygemm_inner_k_tiles(q.shape[0], w) is not None for w in widths)

    def _pack(self, codes: torch.Tensor, width: int) -> torch.Tensor:
        c = codes.to(torch.uint8)
        tiles = tinygemm_inner_k_tiles(self.shape[0], width)
        return torch._convert_weight_to_int4pack((c[:, ::2] << 4 | c[:, 1::2]).contiguous(), tiles)

    def _matmul(self, x: torch.Tensor, packed: torch.Tensor, group: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm(x.contiguous(), packed, group, scales_and_zeros)


@KERNELS.register
class Int8Kernel(Kernel):
    """torch's ``_weight_int8pack_mm``: int8 codes with one scale per output row.

    Asymmetric rows add ``scale * (128 - zero) * sum(x)``, since ``(q - z) = (q - 128) + (128 - z)``.
    Preferred on CPU; on CUDA ``Int8CastKernel`` comes first.
    """

    path = "int8pack_mm"
    preference = 40
    tensor_type = QuantizedTensor
    max_fused_rows: ClassVar[int] = 32  # CPU: rows up to which torch's kernel is as fast as the bf16 codes' matmul
    cpu_block_elements: ClassVar[int] = 1 << 19  # codes widened a block of output rows at a time for longer inputs

    def __init__(self, q: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape = q.shape
        self.register_buffer("codes", (q.codes().to(torch.int16) - 128).to(torch.int8))
        scales = q.row_scales()[:, 0]
        self.register_buffer("scales", scales.to(dtype).contiguous())
        offset = None if q.symmetric else ((128.0 - q.row_zero_points()[:, 0].float()) * scales.float()).to(dtype)
        self.register_buffer("offset", offset)

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        # On CPU, fast for bfloat16 activations only (float32 ones run slower than the dense matmul).
        fast_dtype = dtype == torch.bfloat16 or (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16))
        return q.bits == 8 and q.group_size is None and fast_dtype and hasattr(torch, "_weight_int8pack_mm")

    def analytic_nbytes(self) -> int:
        out, n_in = self.shape
        rows = 2 if self.offset is not None else 1
        return out * n_in + rows * out * self.scales.element_size()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = self.codes.float() * self.scales.float()[:, None]
        if self.offset is not None:
            w = w + self.offset.float()[:, None]
        return w.to(dtype)

    def stored(self) -> QuantizedTensor:
        codes = (self.codes.to(torch.int16) + 128).to(torch.uint8)
        scales = self.scales[:, None]
        if self.offset is None:
            return QuantizedTensor(codes, scales, None, self.shape, 8, None)
        zeros = torch.round(128.0 - self.offset.float() / self.scales.float()).clamp(0, 255).to(torch.uint8)[:, None]
        return QuantizedTensor(codes, scales, zeros, self.shape, 8, None)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if use_fused_row_matmul(x):  # compiled CPU decode: the codes read once as int8 bytes, in the graph
            return (fused_row_matmul(x, self.codes) * self.scales.float()).to(x.dtype)
        if x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.shape[0] > self.max_fused_rows:
            # a prompt: the codes as bf16 (exact: every int8 is a bf16) a block of rows at a time and the dense
            # matmul, then the scales; torch's kernel reads the weight again for every few rows
            y = linear_in_row_blocks(x, lambda start, stop: self.codes[start:stop].to(x.dtype), self.shape,
                                     self.cpu_block_elements)
            return (y.float() * self.scales.float()).to(x.dtype)
        return torch._weight_int8pack_mm(x, self.codes, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).to(self.scales.dtype)
        y = self._matmul(x2)
        if self.offset is not None:
            y = y + x2.sum(-1, keepdim=True) * self.offset
        return y.reshape(*lead, -1).to(x.dtype)


@KERNELS.register
class Int8CastKernel(Int8Kernel):
    """The int8 codes cast to the activation dtype inside the matmul: ``F.linear(x, q.to(x.dtype)) * s``.

    The CUDA int8 weight-only form of gpt-fast and torchao. Eager, it is a cast plus a cuBLAS matmul;
    under ``torch.compile`` inductor fuses the cast into the matmul, so the weight is read as int8 bytes
    once. torch's CUDA ``_weight_int8pack_mm`` is an unfused extern kernel, about 9x slower than the
    bf16 matmul at batch 1 on an H200. bfloat16 only: an fp16 sum of unscaled codes can overflow.
    """

    path = "int8_cast_mm"
    preference = 30

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return q.bits == 8 and q.group_size is None and device.type == "cuda" and dtype == torch.bfloat16

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.codes.to(x.dtype)) * self.scales
