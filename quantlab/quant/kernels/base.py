"""Matmul paths for quantized weights. ``choose_kernel`` picks the fastest one that is correct for a tensor.

Each kernel holds the tensors its path needs (converted once, at quantization
time) in place of the generic packed layout, so the bytes measured are the
bytes the matmul really reads. Preference (each kernel's ``preference``): torch's int4
tinygemm (CUDA), torch's int4 CPU kernel, int8 codes cast inside the matmul (CUDA, bfloat16), torch's int8
weight-only kernel, the bit-plane kernel (CPU), GPTQModel's kernels where installed, FP8 ``_scaled_mm`` when
named, dequantize+matmul.
"""
from __future__ import annotations

from typing import Annotated, Callable, ClassVar, Iterator

import torch
import torch.nn.functional as F
from pydantic import AfterValidator
from torch import nn
from torch._ops import OpOverload

from ...errors import UnsupportedError
from ...native.ops import has_cpp_kernel
from ...registry import UnknownNameError
from ..tensors.base import WeightTensor


def fused_row_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for one row ``x`` ``[1, in]`` written as a float32 multiply and row sum, which inductor
    compiles into one loop reading each weight element once in its stored dtype (int8 codes, bf16) and
    accumulating in float32. On 2 CPU cores it reads a bf16 weight about twice as fast as ``aten::mm``'s
    batch-1 path (``benchmarks/profile_decode.py``); only under ``torch.compile`` (eagerly it would
    materialize the float32 product)."""
    return (x.float() * weight.float()).sum(-1).unsqueeze(0)


def use_fused_row_matmul(x: torch.Tensor) -> bool:
    """Whether a matmul of ``x`` ``[rows, in]`` takes ``fused_row_matmul``: one row, CPU, being compiled."""
    return x.shape[0] == 1 and x.device.type == "cpu" and torch.compiler.is_compiling()


class Kernel(nn.Module):
    """A weight stored for one matmul path; ``forward(x)`` returns ``x @ Wᵀ`` (no bias)."""

    path: ClassVar[str]
    preference: ClassVar[int]  # ``kernel: auto`` tries kernels in ascending preference
    tensor_type: ClassVar[type[WeightTensor] | tuple[type[WeightTensor], ...]] = WeightTensor  # stored forms it takes
    rounded_inputs: ClassVar[frozenset[str]] = frozenset()  # activation formats it rounds itself; if any, it is
    # chosen only for weights whose format rounds its inputs to one of them (W8A8: an integer product)

    @classmethod
    def supports(cls, q: WeightTensor, device: torch.device, dtype: torch.dtype) -> bool:
        raise NotImplementedError

    @classmethod
    def in_auto(cls, device: torch.device) -> bool:
        """Whether ``kernel: auto`` may pick this path on ``device`` (a path that is slower there than
        dequantize+matmul, or recompiles under torch.compile, is only used when named)."""
        return True

    def analytic_nbytes(self) -> int:
        """Bytes this layout needs, from the tensor's shape, bits and groups alone."""
        raise NotImplementedError

    def rounded_matmul(self, x: torch.Tensor, rounding: nn.Module) -> torch.Tensor | None:
        """``rounding(x) @ Wᵀ`` with the rounding fused into the product, or None where this kernel does not fuse
        it (the layer then rounds ``x`` and calls ``forward``)."""
        return None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[out, in]`` this kernel multiplies by."""
        raise NotImplementedError

    def stored(self) -> WeightTensor:
        """The stored form this kernel multiplies by, recovered from its layout (codes, scales and zero points
        as the kernel holds them), so exporters write the numbers that were measured: ``stored().dequantize()``
        equals ``dequantize()``."""
        raise UnsupportedError(f"kernel {self.path} does not give back its stored form")


class DequantKernel(Kernel):
    """Any stored form (a ``WeightTensor``): dequantize it, then a dense matmul. Its tensors are held as buffers
    and the tensor is rebuilt with its own class, so codebook and float forms keep their behaviour.

    On CPU (eager) this goes a block of output rows at a time, so the dense block stays in cache and
    is reused from the heap instead of a fresh, page-faulting allocation the size of the whole weight
    (3-6x faster for a 4096x4096 weight on 2 cores). Elsewhere, and under torch.compile,
    the whole weight at once.
    """

    cpu_block_elements: ClassVar[int] = 1 << 19  # dense elements per block of rows on CPU

    path = "dequantize+matmul"
    preference = 1000  # takes every stored form: the fallback
    tensor_type = WeightTensor

    def __init__(self, q: WeightTensor) -> None:
        super().__init__()
        tensors, self._fields = q.split()
        self._tensor_class, self.shape = type(q), q.shape
        for name, t in tensors.items():
            self.register_buffer(name, t)

    @classmethod
    def supports(cls, q: WeightTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return True

    @property
    def qtensor(self) -> WeightTensor:
        """The stored tensor, rebuilt from this kernel's buffers (on their device)."""
        names = self._tensor_class.tensor_field_names()
        return self._tensor_class(**{n: getattr(self, n) for n in names}, **self._fields)

    def analytic_nbytes(self) -> int:
        return self.qtensor.layout_nbytes()

    def stored(self) -> WeightTensor:
        return self.qtensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.qtensor.dequantize(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or torch.compiler.is_compiling():
            return F.linear(x, self.dequantize(x.dtype))
        q = self.qtensor
        return linear_in_row_blocks(x, lambda start, stop: q.dequantize(x.dtype, slice(start, stop)), self.shape,
                                    self.cpu_block_elements)


OUT_KINDS = {torch.float32: 0, torch.bfloat16: 2}  # the dtypes the C kernels write, by their code in native/*.c


def traced(eager: Callable, op: OpOverload) -> Callable:
    """``op`` (the registered torch op) under ``torch.compile`` or where its CPU kernel is C++, else the plain
    function (an op whose kernel is Python costs the dispatcher's overhead on top, ~15 us a call)."""
    return op if torch.compiler.is_compiling() or has_cpp_kernel(op) else eager


class FusedRowsKernel(Kernel):
    """A C kernel pair: a fused product for a decode step's few rows (up to ``max_fused_rows``, the weight read
    once and decoded in registers), and dequantization of blocks of output rows for longer inputs (prefill,
    perplexity windows), which then use the dense matmul. Subclasses give ``fused`` and ``rows``."""

    max_fused_rows: ClassVar[int] = 8  # rows of x up to which the fused product beats dequantize+matmul (2 cores)
    # the activation dtypes ``fused`` takes as they are (others are widened to float32 first): a kernel that takes
    # bfloat16 gets a bf16 model's activations rounded as the eager model rounds them, also in a compiled graph
    # (where inductor would otherwise fold the widening into the producer and pass unrounded float32)
    fused_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    cpu_block_elements: ClassVar[int] = 1 << 19  # dense elements per block of rows for longer inputs
    shape: tuple[int, int]

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, in]`` (float32, or one of ``fused_dtypes``) times the weight, transposed: ``[M, out]`` float32."""
        raise NotImplementedError

    def rows(self, row0: int, row1: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``[row0, row1)`` of the weight as ``dtype`` (one of ``OUT_KINDS``)."""
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.rows(0, self.shape[0], torch.float32).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.shape[1])
        if x2.shape[0] <= self.max_fused_rows:
            y = self.fused(x2 if x2.dtype in self.fused_dtypes else x2.float())
        else:
            dense = x.dtype if x.dtype in OUT_KINDS else torch.float32
            y = linear_in_row_blocks(x2.to(dense), lambda start, stop: self.rows(start, stop, dense), self.shape,
                                     self.cpu_block_elements)
        return y.reshape(*lead, -1).to(x.dtype)


def bf16_or_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a C product with a bfloat16 entry takes it (a kernel listing bfloat16 in ``fused_dtypes``):
    bfloat16 as it is, any other dtype widened to float32; contiguous."""
    return x.contiguous() if x.dtype == torch.bfloat16 else x.float().contiguous()


def linear_in_row_blocks(x: torch.Tensor, rows: Callable[[int, int], torch.Tensor], shape: tuple[int, int],
                         block_elements: int) -> torch.Tensor:
    """``x @ Wᵀ`` with W built ``rows(start, stop)`` a block of output rows at a time (about ``block_elements``
    weights), so each dense block stays in cache and is reused from the heap instead of a fresh, page-faulting
    allocation the size of the whole weight."""
    out, n_in = shape
    block = max(1, block_elements // n_in)
    return torch.cat([F.linear(x, rows(r, min(r + block, out))) for r in range(0, out, block)], dim=-1)


class KernelRegistry:
    """Matmul paths by name, iterated in order of preference (each kernel's ``preference``, lowest first), so
    the order never depends on which module registered first."""

    def __init__(self) -> None:
        self._kernels: dict[str, type[Kernel]] = {}

    def register(self, cls: type[Kernel]) -> type[Kernel]:
        """Class decorator: ``@KERNELS.register`` adds a kernel under its ``path``."""
        if cls.path in self._kernels:
            raise ValueError(f"kernel '{cls.path}' is already registered")
        self._kernels[cls.path] = cls
        return cls

    def items(self) -> list[tuple[str, type[Kernel]]]:
        return sorted(self._kernels.items(), key=lambda item: item[1].preference)

    def names(self) -> list[str]:
        return [path for path, _ in self.items()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, path: object) -> bool:
        return path in self._kernels

    def __getitem__(self, path: str) -> type[Kernel]:
        return self._kernels[path]

    def check(self, name: str) -> str:
        """``name`` if it is ``auto`` or a registered kernel; else a ValueError listing the known ones (a field
        validator's message)."""
        if name != "auto" and name not in self._kernels:
            raise ValueError(str(UnknownNameError("kernel", name, ["auto", *self.names()])))
        return name


KERNELS = KernelRegistry()
KERNELS.register(DequantKernel)

KernelName = Annotated[str, AfterValidator(KERNELS.check)]  # a format's ``kernel`` field: auto or a registered path


def choose_kernel(q: WeightTensor, device: torch.device, dtype: torch.dtype, allowed: list[str] | None = None,
                  activations: str | None = None) -> Kernel:
    """The first kernel (in order of preference) that supports ``q`` on ``device`` for ``dtype`` activations
    (rounded to the format ``activations`` first, where the weight format says so).

    A kernel that turns out not to handle the tensor when built (``UnsupportedError``) passes the
    choice on to the next one, unless it was the only one allowed.
    """
    reasons: list[str] = []
    for path, cls in KERNELS.items():
        if allowed is None and not cls.in_auto(device):
            continue
        if cls.rounded_inputs and activations not in cls.rounded_inputs:
            continue
        if (allowed is None or path in allowed) and isinstance(q, cls.tensor_type) and cls.supports(q, device, dtype):
            try:
                return DequantKernel(q) if cls is DequantKernel else cls(q, dtype)  # type: ignore[call-arg]
            except UnsupportedError as e:
                reasons.append(str(e))
    raise UnsupportedError(f"kernel {', '.join(allowed or [])} does not support {q.describe()} weights of shape "
                           f"{q.shape} with {str(dtype).removeprefix('torch.')} activations on {device.type}"
                           + (f": {'; '.join(reasons)}" if reasons else ""))
