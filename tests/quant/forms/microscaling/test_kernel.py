"""The microscaling CPU kernels (e2m1 through a table, MXFP8 widened in registers): the stored codes and scales multiplied as held, equal to dequantize-then-matmul, chosen by
``auto``, holding the form's bytes, and running inside ``torch.compile``."""
from __future__ import annotations

import pytest
import torch

from quantlab.quant.forms.float8.kernel import FP8BlockCPUKernel
from quantlab.quant.forms.float8.tensor import quantize_fp8
from quantlab.quant.forms.microscaling import quantize_mx, quantize_nvfp4
from quantlab.quant.forms.microscaling.kernel import E2M1CPUKernel, MXFP8CPUKernel
from quantlab.quant.kernels.base import DequantKernel, choose_kernel

CPU = torch.device("cpu")
FORMS = {"mxfp4": lambda w: quantize_mx(w, "e2m1"), "nvfp4": quantize_nvfp4, "mxfp8": lambda w: quantize_mx(w, "e4m3")}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [1, 3, 5, 40])
def test_the_kernel_equals_dequantize_then_matmul(form: str, rows: int) -> None:
    w = torch.distributions.StudentT(3.0).sample((96, 320)) * 0.02
    q = FORMS[form](w)
    kernel = choose_kernel(q, CPU, torch.float32)
    assert isinstance(kernel, MXFP8CPUKernel if form == "mxfp8" else E2M1CPUKernel)
    x = torch.randn(rows, 320)
    ref = x @ q.dequantize().T
    assert torch.allclose(kernel(x), ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(kernel.dequantize(), q.dequantize())  # the C decoding, bit for bit
    assert kernel.analytic_nbytes() == q.layout_nbytes() == sum(b.numel() * b.element_size() for b in kernel.buffers())
    back = kernel.stored()
    assert type(back) is type(q) and torch.equal(back.dequantize(), q.dequantize())


@pytest.mark.parametrize("rows", [1, 4, 30])
@pytest.mark.parametrize("shape", [(200, 320), (256, 576)])  # partial tiles in both directions, or along the input
def test_block_fp8_equals_dequantize_then_matmul(rows: int, shape: tuple[int, int]) -> None:
    q = quantize_fp8(torch.randn(*shape) * torch.logspace(-1, 1, shape[1]), block_size=128)
    kernel = choose_kernel(q, CPU, torch.float32)
    assert isinstance(kernel, FP8BlockCPUKernel)
    x = torch.randn(rows, shape[1])
    assert torch.allclose(kernel(x), x @ q.dequantize().T, rtol=1e-4, atol=1e-3)
    assert torch.equal(kernel.dequantize(), q.dequantize())
    assert kernel.analytic_nbytes() == q.layout_nbytes() == sum(b.numel() * b.element_size() for b in kernel.buffers())


def test_bfloat16_rows_and_a_width_the_block_kernel_cannot_take_fall_back() -> None:
    w = torch.randn(64, 128)
    kernel = choose_kernel(quantize_nvfp4(w), CPU, torch.bfloat16)
    x = torch.randn(20, 128, dtype=torch.bfloat16)
    y, ref = kernel(x), x.float() @ quantize_nvfp4(w).dequantize().T
    assert y.dtype == torch.bfloat16
    assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2  # bf16's rounding of the activations and output
    assert isinstance(choose_kernel(quantize_fp8(torch.randn(8, 40), block_size=32), CPU, torch.float32), DequantKernel)


def test_the_kernel_runs_inside_torch_compile() -> None:
    q = quantize_mx(torch.randn(64, 128), "e2m1")
    kernel = choose_kernel(q, CPU, torch.float32)
    x = torch.randn(1, 128)
    compiled = torch.compile(kernel, fullgraph=True)
    assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize("n_in", [32, 96, 320, 576, 2048])  # whole turns of 128 codes and every tail
def test_bfloat16_activations_multiply_within_float32_rounding(form: str, rows: int, n_in: int) -> None:
    # a bf16 model's activations and e2m1's table are all bfloat16: the bf16 dot products (where the CPU has them)
    # multiply exactly, and only the float32 sums round
    g = torch.Generator().manual_seed(rows * 7 + n_in)
    q = FORMS[form](torch.randn(40, n_in, generator=g) * torch.logspace(-2, 0, n_in))
    kernel = E2M1CPUKernel(q, torch.bfloat16)
    x = torch.randn(rows, n_in, generator=g).bfloat16().float()
    y = kernel.fused(x).double()
    w = q.dequantize().double()
    ref, magnitude = x.double() @ w.T, x.double().abs() @ w.abs().T
    assert ((y - ref).abs() <= magnitude * 2 ** -24 * (n_in / 4 + 8)).all()
    assert torch.equal(kernel.fused(x.bfloat16()), kernel.fused(x))  # given as bfloat16 itself: the same product
