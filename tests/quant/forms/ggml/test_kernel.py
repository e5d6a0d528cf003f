"""The ggml block kernels: GGUF-typed weights multiplied as stored, against their dequantized reference,
(``ggml_q8_cpu``) as llama.cpp's CPU backend multiplies them, against its own dot products, and
(``ggml_repack_cpu``) repacked as llama.cpp repacks Q4_0, IQ4_NL and Q4_K, against its own GEMV."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import rel_error
from quantlab.quant.forms.ggml.kernel import (
    GGMLCPUKernel,
    GGMLQ8CPUKernel,
    GGMLRepackCPUKernel,
    dequantize_blocks,
    dot_products_available,
    ggml_dequantize_repacked,
    ggml_matmul_q8,
    quantize_ggml,
    repack_available,
    repack_blocks,
    unpack_blocks,
)
from quantlab.quant.forms.ggml.tensor import GGML_TYPES
from quantlab.quant.kernels.base import DequantKernel, choose_kernel
from tests.quant.forms.ggml.ggml_llama_cpp import llama_cpp_cpu_product, llama_cpp_repacked_product

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


needs_dot = pytest.mark.skipif(not dot_products_available(), reason="ggml's dot products need AVX2, FMA, F16C")


@needs_dot
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_8_bit_activation_product_agrees_within_its_rounding(kind: str, rows: int, dtype: torch.dtype) -> None:
    n_in = 1536 if GGML_TYPES[kind].block == 256 else 576
    q = quantize_ggml(_weight(96, n_in), kind)
    kernel = GGMLQ8CPUKernel(q, dtype)
    x = _x(n_in, rows, dtype)
    y = kernel(x)
    ref = F.linear(x.float(), q.dequantize())
    assert y.dtype == dtype and y.shape == (rows, 96)
    if rows > kernel.max_fused_rows:  # a prefill's rows: the dense matmul of the dequantized weight, unrounded
        assert rel_error(y.float(), ref) < (1e-5 if dtype == torch.float32 else 1e-2)
        return
    # activations rounded to 8 bits per block of 32 or 256: about 0.5-0.8% of the product (1.1% bound)
    assert 1e-4 < rel_error(y.float(), ref) < (0.011 if dtype == torch.float32 else 0.015)


@needs_dot
@pytest.mark.llama_cpp
@pytest.mark.parametrize("kind", TYPES)
def test_the_8_bit_activation_product_is_llama_cpps_cpu_dot_product(kind: str) -> None:
    n_in = 1536
    q, x = quantize_ggml(_weight(64, n_in), kind), _x(n_in)
    theirs = llama_cpp_cpu_product(GGML_TYPES[kind].ggml_id, q.blocks.numpy(), x.numpy()[0])
    if theirs is None:
        pytest.skip("llama-cpp-python is not installed")
    ours = ggml_matmul_q8(x, q.blocks, GGML_TYPES[kind].ggml_id).numpy()[0]
    assert np.abs(ours - theirs).max() <= 1e-6 * np.abs(theirs).max()  # the same sums (Q5_K: within 1 ulp)


def test_bytes_held_are_the_blocks() -> None:
    for kind in ("Q4_K", "Q6_K", "Q8_0"):
        kernel = GGMLCPUKernel(quantize_ggml(_weight(), kind), torch.float32)
        held = sum(t.numel() * t.element_size() for t in kernel.buffers())
        assert held == kernel.analytic_nbytes() == 96 * 1536 // GGML_TYPES[kind].block * GGML_TYPES[kind].block_bytes


def test_auto_takes_llama_cpps_product_where_the_cpu_has_it_and_float16_rows_dequantize() -> None:
    chosen = choose_kernel(quantize_ggml(_weight(), "Q6_K"), CPU, torch.bfloat16)
    assert type(chosen) is (GGMLQ8CPUKernel if dot_products_available() else GGMLCPUKernel)
    for kind in REPACKED:  # repacked where llama.cpp repacks: rows in eights, AVX2
        assert type(choose_kernel(quantize_ggml(_weight(), kind), CPU, torch.float32)) is (
            GGMLRepackCPUKernel if repack_available(kind) else type(chosen))
        assert type(choose_kernel(quantize_ggml(_weight(12), kind), CPU, torch.float32)) is type(chosen)
    assert isinstance(choose_kernel(quantize_ggml(_weight(8, 100), "F16"), CPU, torch.float32), DequantKernel)


@pytest.mark.parametrize("cls", [GGMLCPUKernel, pytest.param(GGMLQ8CPUKernel, marks=needs_dot),
                                 pytest.param(GGMLRepackCPUKernel, marks=needs_dot)])
def test_torch_compile_captures_the_ops_and_batched_inputs_keep_their_shape(cls: type) -> None:
    kernel = cls(quantize_ggml(_weight(), "Q4_K"), torch.float32)
    compiled = torch.compile(kernel, backend="aot_eager", fullgraph=True)
    for x in (_x(rows=1), _x(rows=20)):
        assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-6)
    assert kernel(torch.randn(2, 3, 1536)).shape == (2, 3, 96)


REPACKED = ("Q4_0", "IQ4_NL", "Q4_K")
needs_repack = pytest.mark.skipif(not repack_available("Q4_K"), reason="ggml's repacked GEMV needs AVX2, FMA, F16C")


def _n_in(kind: str) -> int:
    return 1536 if GGML_TYPES[kind].block == 256 else 576  # 576: 18 blocks of 32, not a multiple of 8 blocks


@needs_repack
@pytest.mark.parametrize("kind", REPACKED)
@pytest.mark.parametrize("out", [8, 24, 96])
def test_repacking_is_undone_byte_for_byte(kind: str, out: int) -> None:
    n_in = _n_in(kind)
    raw = torch.randint(0, 256, (out, GGML_TYPES[kind].block_bytes * n_in // GGML_TYPES[kind].block),
                        dtype=torch.uint8, generator=torch.Generator().manual_seed(2))  # any bytes: every bit kept
    packed = repack_blocks(raw, kind, n_in)
    assert packed.shape == raw.shape and not torch.equal(packed, raw)
    assert torch.equal(unpack_blocks(packed, kind, n_in), raw)
    assert torch.equal(unpack_blocks(packed, kind, n_in, 3, out - 2), raw[3:out - 2])  # rows off the groups of 8


@needs_repack
@pytest.mark.parametrize("kind", REPACKED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_prefill_rows_of_a_repacked_weight_are_the_unpacked_blocks_dequantized_bit_for_bit(kind: str,
                                                                                          dtype: torch.dtype) -> None:
    # one pass in C (unpack, ggml's dequantizer, rounding) against the three steps it fuses, rows off the groups of 8
    n_in = _n_in(kind)
    q = quantize_ggml(_weight(40, n_in) * torch.logspace(-3, 2, n_in), kind)  # scales across the bf16 range
    packed = repack_blocks(q.blocks, kind, n_in)
    expected = dequantize_blocks(unpack_blocks(packed, kind, n_in, 3, 37), kind, n_in).to(dtype)
    got = ggml_dequantize_repacked(packed, kind, n_in, 3, 37, dtype)
    assert got.dtype == dtype and torch.equal(got, expected)
    assert ggml_dequantize_repacked(packed, kind, n_in, 5, 5, dtype).shape == (0, n_in)


@needs_repack
@pytest.mark.parametrize("kind", REPACKED)
def test_the_repacked_kernel_holds_the_blocks_bytes_and_gives_them_back(kind: str) -> None:
    q = quantize_ggml(_weight(96, _n_in(kind)), kind)
    kernel = GGMLRepackCPUKernel(q, torch.float32)
    assert torch.equal(kernel.stored().blocks, q.blocks)
    assert torch.equal(kernel.dequantize(), q.dequantize())
    held = sum(t.numel() * t.element_size() for t in kernel.buffers())
    assert held == kernel.analytic_nbytes() == q.blocks.numel()


@needs_repack
@pytest.mark.parametrize("kind", REPACKED)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out", [8, 40])
def test_the_repacked_product_is_the_row_at_a_time_product(kind: str, rows: int, dtype: torch.dtype, out: int) -> None:
    n_in = _n_in(kind)
    q = quantize_ggml(_weight(out, n_in), kind)
    x = _x(n_in, rows, dtype)
    ours, row_wise = GGMLRepackCPUKernel(q, dtype)(x), GGMLQ8CPUKernel(q, dtype)(x)
    assert ours.dtype == dtype and ours.shape == (rows, out)
    # the same integer sums and scales, summed in another order: float32 rounding apart
    assert (ours.float() - row_wise.float()).abs().max() <= (2e-6 if dtype == torch.float32 else 1e-2) * row_wise.float().abs().max()
    assert rel_error(ours.float(), F.linear(x.float(), q.dequantize())) < (0.011 if dtype == torch.float32 else 0.015)


@needs_repack
@pytest.mark.llama_cpp
@pytest.mark.parametrize("kind", REPACKED)
def test_the_repacked_product_is_llama_cpps_gemv(kind: str) -> None:
    n_in = _n_in(kind)
    q, x = quantize_ggml(_weight(64, n_in), kind), _x(n_in)
    packed = repack_blocks(q.blocks, kind, n_in)
    theirs = llama_cpp_repacked_product(kind, GGML_TYPES[kind].ggml_id, packed.numpy(), x.numpy()[0])
    if theirs is None:
        pytest.skip("llama-cpp-python is not installed")
    ours = GGMLRepackCPUKernel(q, torch.float32).fused(x).numpy()[0]
    assert np.array_equal(ours, theirs)  # the same code on the same bytes: the same floats
