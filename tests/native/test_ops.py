"""The C kernels' torch ops with their C++ kernels (``native.load_ops``): each is registered where a C++ compiler
is found, a call goes to it without entering Python, and it gives the same bits as the op's Python function for
1-13 rows of either activation dtype (both call the same C function with the same arguments)."""
from __future__ import annotations

import pytest
import torch

from quantlab import native
from quantlab.kv import code_attention
from quantlab.kv.packed import Codec
from quantlab.kv.static import CodeStore
from quantlab.native.ops import has_cpp_kernel
from quantlab.quant.embedding import BlockEmbedding
from quantlab.quant.forms.affine import bitplane, int8_act
from quantlab.quant.forms.affine.tensor import quantize_tensor
from quantlab.quant.forms.codebook import kernel as codebook
from quantlab.quant.forms.codebook.tensor import quantize_codebook
from quantlab.quant.forms.float8 import kernel as float8
from quantlab.quant.forms.float8.tensor import quantize_fp8
from quantlab.quant.forms.ggml import kernel as ggml
from quantlab.quant.forms.microscaling import kernel as microscaling
from quantlab.quant.forms.microscaling.quantize import quantize_mx, quantize_nvfp4
from quantlab.quant.kernels import base as kernels_base
from quantlab.quant.kernels import half_rows

ROWS = [1, 2, 5, 13]
PRODUCTS = {  # library: its ops with a C++ kernel
    "lut4": [codebook.matmul_op, microscaling.matmul_op],
    "fp8": [float8.matmul_op, float8.blocks_matmul_op],
    "bitplane": [bitplane.matmul_op],
    "int8_act": [int8_act.matmul_op],
    "ggml": [ggml.matmul_q8_op, ggml.matmul_repacked_op, ggml.dequantize_op],  # the last: a step's embedding rows
    "kv_attention": [code_attention.scores_op, code_attention.values_op, code_attention.ring_scores_op,
                     code_attention.ring_values_op],
    "half_rows": [half_rows.matmul_op],
}


@pytest.fixture(scope="module", autouse=True)
def cpp_ops() -> None:
    if native.cxx_compiler() is None:
        pytest.skip("no C++ compiler: the ops keep their Python kernels")
    for name in PRODUCTS:
        assert native.load_ops(name), native.OPS_FAILURES.get(name)


def _weight(out: int, n_in: int) -> torch.Tensor:
    w = torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05
    w[:, 3] *= 40
    return w


def _kernels() -> dict[str, kernels_base.Kernel]:
    """One kernel of each op, as ``auto`` would build it for a bf16 model (widths off the SIMD width where the form
    allows)."""
    w = _weight(24, 608)
    w_k = _weight(64, 512)  # whole Q4_K super-blocks, 8 rows at a time for the repacked layout
    return {
        "lut4_matmul": codebook.Lut4CPUKernel(quantize_codebook(_weight(24, 576), "nf4", 64, True), torch.bfloat16),
        "e2m1_matmul mxfp4": microscaling.E2M1CPUKernel(quantize_mx(w, "e2m1"), torch.bfloat16),
        "e2m1_matmul nvfp4": microscaling.E2M1CPUKernel(quantize_nvfp4(w), torch.bfloat16),
        "fp8_matmul e4m3": float8.FP8CPUKernel(quantize_fp8(w, "e4m3"), torch.bfloat16),
        "fp8_matmul e5m2": float8.FP8CPUKernel(quantize_fp8(w, "e5m2"), torch.bfloat16),
        "fp8_blocks_matmul": microscaling.MXFP8CPUKernel(quantize_mx(w, "e4m3"), torch.bfloat16),
        "bitplane_matmul int3": bitplane.BitplaneCPUKernel(quantize_tensor(_weight(24, 640), 3, 128), torch.bfloat16),
        "bitplane_matmul int2": bitplane.BitplaneCPUKernel(quantize_tensor(_weight(24, 640), 2, 64), torch.bfloat16),
        "int8_act_matmul": int8_act.Int8ActivationKernel(quantize_tensor(_weight(24, 640), 8, None), torch.float32),
        "ggml_matmul_q8": ggml.GGMLQ8CPUKernel(ggml.quantize_ggml(_weight(24, 576), "Q5_0"), torch.bfloat16),
        "ggml_matmul_repacked": ggml.GGMLRepackCPUKernel(ggml.quantize_ggml(w_k, "Q4_K"), torch.bfloat16),
    }


def test_every_library_s_products_have_a_cpp_kernel_and_no_other_op_does() -> None:
    for name, ops in PRODUCTS.items():
        for op in ops:
            assert has_cpp_kernel(op), (name, op)
    assert not has_cpp_kernel(codebook.dequantize_op)  # prefill's dequantization stays in Python: its call is long


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_kernels_give_the_python_functions_bits(rows: int, dtype: torch.dtype,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, kernel in _kernels().items():
        if name == "ggml_matmul_repacked" and not ggml.repack_available("Q4_K"):
            continue
        x = torch.randn(rows, kernel.shape[1], generator=torch.Generator().manual_seed(rows)).to(dtype)
        through_cpp = kernel(x)
        monkeypatch.setattr(kernels_base, "has_cpp_kernel", lambda op: False)
        through_python = kernel(x)
        monkeypatch.undo()
        assert through_cpp.dtype == dtype and torch.equal(through_cpp, through_python), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_embedding_rows_give_the_python_functions_bits(dtype: torch.dtype,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ids = torch.tensor([[3, 0, 39, 3]])
    for ggml_type, n_in in (("Q8_0", 576), ("Q4_K", 512), ("IQ4_NL", 608)):
        table = ggml.quantize_ggml(_weight(40, n_in), ggml_type)
        embedding = BlockEmbedding(table, dtype)
        through_cpp = embedding(ids)
        monkeypatch.setattr(kernels_base, "has_cpp_kernel", lambda op: False)
        through_python = embedding(ids)
        monkeypatch.undo()
        expected = ggml.dequantize_blocks(table.blocks, ggml_type, n_in)[ids].to(dtype)
        assert through_cpp.dtype == dtype and torch.equal(through_cpp, through_python), ggml_type
        assert torch.equal(through_cpp, expected), ggml_type


@pytest.mark.parametrize("codec", [Codec(bits=8, group_size=32), Codec(bits=4, group_size=64), Codec(dtype=torch.bfloat16),
                                   Codec(element="nvfp4"), Codec(bits=2, axis="channel", group_size=32)], ids=str)
def test_the_kv_kernels_give_the_python_functions_bits(codec: Codec) -> None:
    b, h, slots, d, g = 1, 2, 64, 64, 3
    torch.manual_seed(0)
    store = CodeStore(codec, b, h, slots, d, torch.device("cpu"))
    store.write(torch.arange(slots), torch.randn(b, h, slots, d) * 3)
    q, p = torch.randn(b * h, g, d), torch.softmax(torch.randn(b * h, g, slots), -1)
    args = code_attention._store_args(store)
    for valid in (slots, 32, 0):
        n = torch.tensor(valid)
        assert torch.equal(code_attention.scores_op(*args, n, q), code_attention.kv_scores(*args, n, q))
        if codec.axis != "channel":  # values are per position
            assert torch.equal(code_attention.values_op(*args, n, p), code_attention.kv_values(*args, n, p))
        ring, pr = torch.randn(b, h, 5, d).to(torch.bfloat16), torch.rand(b * h, g, slots + 5)
        assert torch.equal(code_attention.ring_scores_op(*args, n, q, ring), code_attention.kv_scores(*args, n, q, ring))
        if codec.axis != "channel":
            assert torch.equal(code_attention.ring_values_op(*args, n, pr, ring),
                               code_attention.kv_values(*args, n, pr, ring))


def test_eager_and_compiled_calls_never_enter_the_python_function(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = microscaling.E2M1CPUKernel(quantize_nvfp4(_weight(24, 608)), torch.bfloat16)
    x = torch.randn(1, 608).to(torch.bfloat16)
    expected = kernel(x)

    def no_library(*args: object) -> None:
        raise AssertionError("the Python function ran")

    monkeypatch.setattr(codebook, "library", no_library)  # the Python function's first call
    with pytest.raises(AssertionError):
        microscaling.e2m1_matmul(x.float(), kernel.codes, kernel.scales, kernel.global_scale, kernel.table,
                                 kernel.e4m3, kernel.block)
    assert torch.equal(kernel(x), expected)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(kernel, fullgraph=True)(x), expected)
