"""The dense half-precision row kernel (``quant/kernels/half_rows.py``): every build's path (vdpbf16ps, AVX-512
FMA, scalar) gives float32 sums of the exact products within float32 rounding, for 1-13 rows, widths off the
SIMD width and both 16-bit dtypes; the compiled engine's one-row linears take it where it is vectorized."""
from __future__ import annotations

import pytest
import torch

from quantlab.errors import UnsupportedError
from quantlab.quant.kernels import half_rows

BUILDS = {"native": (), "no-avx512bf16": ("-mno-avx512bf16",), "scalar": ("-mno-avx512f",)}


def _library(flags: tuple[str, ...]):
    try:
        return half_rows.library(flags)
    except UnsupportedError as e:
        pytest.skip(f"no C compiler: {e}")


def _product(lib, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32)
    lib.half_rows_matmul(w.data_ptr(), x.data_ptr(), y.data_ptr(), half_rows.KINDS[w.dtype], x.shape[0], w.shape[0],
                         x.shape[1])
    return y


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,out,n_in", [(1, 13, 576), (2, 5, 33), (3, 4, 70), (5, 9, 1), (13, 7, 608),
                                           (4, 1, 64), (1, 101, 577)])
def test_every_path_sums_the_exact_products_within_float32_rounding(build: str, dtype: torch.dtype, rows: int,
                                                                     out: int, n_in: int) -> None:
    lib = _library(BUILDS[build])
    g = torch.Generator().manual_seed(rows * 1000 + n_in)
    w = torch.randn(out, n_in, generator=g).to(dtype)
    w[:, 0] *= 30  # an outlier column
    x = torch.randn(rows, n_in, generator=g).to(dtype)
    exact = x.double() @ w.double().T  # the 16-bit products are exact in float64
    magnitude = x.double().abs() @ w.double().abs().T
    y = _product(lib, x, w)
    assert y.dtype == torch.float32 and y.shape == (rows, out)
    assert ((y.double() - exact).abs() <= n_in * 2 ** -24 * magnitude + 1e-30).all()


def test_the_machines_build_reports_its_path_and_the_op_gives_the_functions_bits() -> None:
    lib = _library(())
    assert lib.half_rows_path() in (0, 1, 2)
    assert _library(BUILDS["scalar"]).half_rows_path() == 0
    if not half_rows.available():
        pytest.skip("no vectorized path on this CPU: the engine keeps the compiled loop")
    x, w = torch.randn(3, 100).bfloat16(), torch.randn(17, 100).bfloat16()
    assert torch.equal(half_rows.matmul_op(x, w), half_rows.half_rows_matmul(x, w))
    assert torch.equal(half_rows.matmul_op(x.float(), w), half_rows.half_rows_matmul(x, w))  # read in w's dtype


@pytest.mark.slow
def test_the_compiled_one_row_linear_takes_the_kernel_where_it_is_vectorized() -> None:
    from quantlab.engine.torch.compiled import compile_options, fused_row_linears

    if not half_rows.available():
        assert compile_options(torch.device("cpu"))["half_linears"] == "fused_row_matmul"
        pytest.skip("no vectorized path on this CPU")
    assert compile_options(torch.device("cpu"))["half_linears"] == "half_rows"
    linear = torch.nn.Linear(577, 37).to(torch.bfloat16)
    x = torch.randn(1, 577).bfloat16()
    expected = (half_rows.matmul_op(x, linear.weight) + linear.bias.float()).bfloat16()
    torch._dynamo.reset()
    with fused_row_linears(linear, "half_rows") as changed:
        got = torch.compile(linear, dynamic=False)(x)
    assert changed == 1 and torch.equal(got, expected)
    torch._dynamo.reset()
    with fused_row_linears(linear, "fused_row_matmul"):  # the compiled loop instead: same sums up to rounding
        loop = torch.compile(linear, dynamic=False)(x)
    assert torch.allclose(loop.float(), expected.float(), rtol=1e-2, atol=1e-2)
