import pytest
import torch

from quantlab import gptq_quantize, quantize_tensor
from quantlab.quant.kernel_gptqmodel import GPTQModelKernel, gptqmodel_available
from quantlab.quant.kernels import DequantKernel, Int4CPUKernel, Int4TinyGemmKernel, Int8Kernel, choose_kernel

CPU = torch.device("cpu")
# Grouped shapes torch's kernels do not take go to GPTQModel's kernels where it is installed.
GROUPED_FALLBACK = GPTQModelKernel if gptqmodel_available() else DequantKernel


def _weight(out: int = 96, n_in: int = 512) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _x(n_in: int = 512, rows: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("bits,group_size,symmetric,expected", [
    (4, 128, False, Int4CPUKernel), (4, 32, True, Int4CPUKernel), (4, None, False, Int4CPUKernel),
    (8, None, False, Int8Kernel), (8, None, True, Int8Kernel), (8, 128, False, GROUPED_FALLBACK),
    (3, 128, False, DequantKernel), (4, 16, False, GROUPED_FALLBACK),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_choice_and_agreement_with_the_dequantized_reference(bits, group_size, symmetric, expected, dtype) -> None:
    q = quantize_tensor(_weight(), bits, group_size, symmetric)
    kernel = choose_kernel(q, CPU, dtype)
    # torch's CPU int kernels are fast for bfloat16 activations only, so float32 ones dequantize.
    assert type(kernel) is (expected if dtype == torch.bfloat16 else DequantKernel)
    x = _x(dtype=dtype)
    reference = x.float() @ q.dequantize().T
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert _rel(kernel(x), reference) < tol
    assert kernel(x).dtype == dtype
    assert _rel(kernel.dequantize(), q.dequantize()) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("cls", [Int4CPUKernel, Int8Kernel, DequantKernel])
def test_kernel_bytes_match_their_formula(cls) -> None:
    q = quantize_tensor(_weight(), 8 if cls is Int8Kernel else 4, None if cls is Int8Kernel else 64)
    kernel = cls(q) if cls is DequantKernel else cls(q, torch.bfloat16)
    held = sum(t.numel() * t.element_size() for t in kernel.buffers())
    assert held == kernel.analytic_nbytes()
    assert held < 96 * 512 * 2 * (0.3 if cls is Int4CPUKernel else 0.55)


def test_act_order_tensor_runs_on_the_int4_kernel_with_a_column_order() -> None:
    w, x = _weight(), _x(rows=256)
    q = gptq_quantize(w, 2 * x.T @ x / 256, 4, 64, act_order=True)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert isinstance(kernel, Int4CPUKernel) and kernel.column_order is not None
    assert _rel(kernel(x.bfloat16()), x @ q.dequantize().T) < 2e-2
    assert _rel(kernel.dequantize(), q.dequantize()) < 1e-2


def test_a_kernel_can_be_forced_and_batched_inputs_keep_their_shape() -> None:
    q = quantize_tensor(_weight(), 4, 128)
    kernel = choose_kernel(q, CPU, torch.float32, ["dequantize+matmul"])
    assert isinstance(kernel, DequantKernel)
    assert kernel(torch.randn(2, 3, 512)).shape == (2, 3, 96)
    assert choose_kernel(q, CPU, torch.bfloat16)(torch.randn(2, 3, 512).bfloat16()).shape == (2, 3, 96)


@pytest.mark.gpu
def test_tinygemm_on_cuda_agrees_with_the_reference() -> None:
    dev = torch.device("cuda")
    q = quantize_tensor(_weight(256, 1024).to(dev), 4, 128)
    kernel = choose_kernel(q, dev, torch.bfloat16)
    assert isinstance(kernel, Int4TinyGemmKernel)
    x = _x(1024, dtype=torch.bfloat16).to(dev)
    assert _rel(kernel(x), x.float() @ q.dequantize().T) < 2e-2
