"""The ggml block kernel: GGUF-typed weights multiplied as stored, against their dequantized reference."""
import pytest
import torch
import torch.nn.functional as F

from conftest import rel_error
from quantlab.quant.kernels.base import DequantKernel, choose_kernel
from quantlab.quant.kernels.ggml import GGMLCPUKernel, quantize_ggml
from quantlab.quant.tensors.ggml_blocks import GGML_TYPES

CPU = torch.device("cpu")
TYPES = [t for t in GGML_TYPES if t != "F16"]


def _weight(out: int = 96, n_in: int = 1536) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _x(n_in: int = 1536, rows: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("kind", TYPES)
def test_dequantization_is_the_stored_forms_to_the_bit(kind: str) -> None:
    q = quantize_ggml(_weight(), kind)
    kernel = GGMLCPUKernel(q, torch.float32)
    assert torch.equal(kernel.dequantize(), q.dequantize())
    assert torch.equal(kernel.stored().blocks, q.blocks)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_agrees_with_the_dequantized_reference(kind: str, rows: int, dtype: torch.dtype) -> None:
    n_in = 1536 if GGML_TYPES[kind].block == 256 else 576  # 576: a row of 18 blocks of 32 (SmolLM2's hidden size)
    q = quantize_ggml(_weight(96, n_in), kind)
    kernel = GGMLCPUKernel(q, dtype)
    x = _x(n_in, rows, dtype)
    y = kernel(x)
    assert y.dtype == dtype and y.shape == (rows, 96)
    assert rel_error(y.float(), F.linear(x.float(), q.dequantize())) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_bytes_held_are_the_blocks() -> None:
    for kind in ("Q4_K", "Q6_K", "Q8_0"):
        kernel = GGMLCPUKernel(quantize_ggml(_weight(), kind), torch.float32)
        held = sum(t.numel() * t.element_size() for t in kernel.buffers())
        assert held == kernel.analytic_nbytes() == 96 * 1536 // GGML_TYPES[kind].block * GGML_TYPES[kind].block_bytes


def test_auto_takes_it_on_cpu_and_float16_rows_dequantize() -> None:
    assert isinstance(choose_kernel(quantize_ggml(_weight(), "Q4_K"), CPU, torch.bfloat16), GGMLCPUKernel)
    assert isinstance(choose_kernel(quantize_ggml(_weight(8, 100), "F16"), CPU, torch.float32), DequantKernel)


def test_torch_compile_captures_the_ops_and_batched_inputs_keep_their_shape() -> None:
    kernel = GGMLCPUKernel(quantize_ggml(_weight(), "Q4_K"), torch.float32)
    compiled = torch.compile(kernel, backend="aot_eager", fullgraph=True)
    for x in (_x(rows=1), _x(rows=20)):
        assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-6)
    assert kernel(torch.randn(2, 3, 1536)).shape == (2, 3, 96)
