"""The 4-bit codebook CPU kernel: NF4 and FP4 as stored, multiplied through their table."""
import pytest
import torch
import torch.nn.functional as F

from conftest import rel_error
from quantlab.errors import UnsupportedError
from quantlab.quant.forms.codebook import kernel as kernel_lut4
from quantlab.quant.forms.codebook.kernel import Lut4CPUKernel
from quantlab.quant.forms.codebook.tensor import quantize_codebook
from quantlab.quant.kernels.base import DequantKernel, choose_kernel

CPU = torch.device("cpu")


def _weight(out: int = 96, n_in: int = 576) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _x(n_in: int = 576, rows: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("codebook", ["nf4", "fp4"])
@pytest.mark.parametrize("block_size, double_quant", [(64, False), (64, True), (32, True), (32, False)])
def test_dequantization_is_the_stored_forms_to_the_bit(codebook: str, block_size: int, double_quant: bool) -> None:
    q = quantize_codebook(_weight(), codebook, block_size, double_quant)
    kernel = Lut4CPUKernel(q, torch.float32)
    assert torch.equal(kernel.dequantize(), q.dequantize())
    assert torch.equal(kernel.dequantize(torch.bfloat16), q.dequantize(torch.bfloat16))


@pytest.mark.parametrize("codebook, double_quant", [("nf4", True), ("nf4", False), ("fp4", False)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_agrees_with_the_dequantized_reference(codebook: str, double_quant: bool, rows: int,
                                                      dtype: torch.dtype) -> None:
    q = quantize_codebook(_weight(), codebook, 64, double_quant)
    kernel = Lut4CPUKernel(q, dtype)
    x = _x(rows=rows, dtype=dtype)
    ref = F.linear(x.float(), q.dequantize())
    y = kernel(x)
    assert y.dtype == dtype and y.shape == (rows, 96)
    assert rel_error(y.float(), ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_bytes_held_are_the_stored_forms() -> None:
    for double_quant in (False, True):
        q = quantize_codebook(_weight(1536, 576), "nf4", 64, double_quant)
        kernel = Lut4CPUKernel(q, torch.bfloat16)
        held = sum(t.numel() * t.element_size() for t in kernel.buffers())
        assert held == kernel.analytic_nbytes() == q.layout_nbytes()
    assert 8 * held / (1536 * 576) < 4.2  # NF4 with double-quantized maxima: about 4.127 bits per weight


def test_auto_takes_it_for_codebooks_whose_blocks_lie_within_rows() -> None:
    assert isinstance(choose_kernel(quantize_codebook(_weight(), "nf4", 64), CPU, torch.bfloat16), Lut4CPUKernel)
    assert isinstance(choose_kernel(quantize_codebook(_weight(), "fp4", 64, True), CPU, torch.float32), Lut4CPUKernel)
    # a block that straddles rows (576 is not a multiple of 128), or float16 activations: dequantize+matmul
    assert isinstance(choose_kernel(quantize_codebook(_weight(), "nf4", 128), CPU, torch.bfloat16), DequantKernel)
    assert isinstance(choose_kernel(quantize_codebook(_weight(), "nf4", 64), CPU, torch.float16), DequantKernel)


def test_torch_compile_captures_the_ops_and_batched_inputs_keep_their_shape() -> None:
    kernel = Lut4CPUKernel(quantize_codebook(_weight(), "nf4", 64, True), torch.float32)
    assert kernel(torch.randn(2, 3, 576)).shape == (2, 3, 96)
    compiled = torch.compile(kernel, backend="aot_eager", fullgraph=True)
    for rows in (1, 16):  # the fused op and the dense path, each without a graph break
        x = _x(rows=rows)
        assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-6)


def test_a_kernel_that_cannot_be_built_passes_the_choice_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library():
        raise UnsupportedError("building the lut4 kernel failed")

    monkeypatch.setattr(kernel_lut4, "library", no_library)
    assert isinstance(choose_kernel(quantize_codebook(_weight(), "nf4", 64), CPU, torch.bfloat16), DequantKernel)
