"""The float8 CPU kernel: e4m3fn and e5m2 codes as stored, widened to floats in registers."""
import pytest
import torch
import torch.nn.functional as F

from conftest import rel_error
from quantlab.errors import UnsupportedError
from quantlab.quant.forms.float8 import kernel as kernel_fp8
from quantlab.quant.forms.float8.kernel import FP8CPUKernel
from quantlab.quant.forms.float8.tensor import quantize_fp8
from quantlab.quant.kernels.base import DequantKernel, choose_kernel

CPU = torch.device("cpu")


def _weight(out: int = 96, n_in: int = 584) -> torch.Tensor:
    """584 inputs: 36 blocks of 16 and a tail of 8; the first row holds subnormal and zero codes."""
    w = torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05
    w[0, :8] = torch.tensor([1e-5, -3e-6, 0.0, 2.0, -1e-7, 5e-4, 1e-3, -0.2])
    return w


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_every_code_decodes_to_the_stored_value(kind: str, per_tensor: bool) -> None:
    q = quantize_fp8(_weight(), kind, per_tensor)
    kernel = FP8CPUKernel(q, torch.float32)
    assert torch.equal(kernel.dequantize(), q.dequantize())
    assert torch.equal(kernel.dequantize(torch.bfloat16), q.dequantize(torch.bfloat16))
    every = torch.arange(256, dtype=torch.uint8).view(getattr(torch, {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[kind]))
    finite = every.float().isfinite()
    codes = every[finite].reshape(1, -1)
    table = FP8CPUKernel(type(q)(codes, torch.ones(1, 1), tuple(codes.shape)), torch.float32).dequantize()
    assert torch.equal(table, codes.float())  # all finite codes, subnormals included


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_agrees_with_the_dequantized_reference(kind: str, rows: int, dtype: torch.dtype) -> None:
    q = quantize_fp8(_weight(), kind)
    kernel = FP8CPUKernel(q, dtype)
    x = torch.randn(rows, 584, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = kernel(x)
    assert y.dtype == dtype and y.shape == (rows, 96)
    assert rel_error(y.float(), F.linear(x.float(), q.dequantize())) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_bytes_held_are_the_stored_forms_and_auto_takes_it_on_cpu() -> None:
    for per_tensor in (False, True):
        q = quantize_fp8(_weight(), "e4m3", per_tensor)
        kernel = choose_kernel(q, CPU, torch.bfloat16)
        assert isinstance(kernel, FP8CPUKernel)
        held = sum(t.numel() * t.element_size() for t in kernel.buffers())
        assert held == kernel.analytic_nbytes() == q.layout_nbytes() == 96 * 584 + 4 * (1 if per_tensor else 96)
    assert isinstance(choose_kernel(quantize_fp8(_weight()), CPU, torch.float16), DequantKernel)


def test_torch_compile_captures_the_ops() -> None:
    kernel = FP8CPUKernel(quantize_fp8(_weight(), "e4m3"), torch.float32)
    compiled = torch.compile(kernel, backend="aot_eager", fullgraph=True)
    for rows in (1, 16):
        x = torch.randn(rows, 584)
        assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-6)


def test_a_kernel_that_cannot_be_built_passes_the_choice_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library():
        raise UnsupportedError("building the fp8 kernel failed")

    monkeypatch.setattr(kernel_fp8, "library", no_library)
    assert isinstance(choose_kernel(quantize_fp8(_weight()), CPU, torch.bfloat16), DequantKernel)
