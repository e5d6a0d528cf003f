"""Every kernel gives back the stored form it multiplies by: the codes exactly, and a dequantization equal to the
kernel's own, whatever its layout (bit planes, torch's opaque int4 pack, int8 rows, lookup codes, float8)."""
import pytest
import torch

from quantlab import gptq_quantize, quantize_tensor
from quantlab.quant.forms.affine.bitplane import BitplaneCPUKernel
from quantlab.quant.forms.affine.float_zero import quantize_float_zero
from quantlab.quant.forms.affine.torch_int import Int4CPUKernel, Int8Kernel
from quantlab.quant.forms.codebook.kernel import Lut4CPUKernel
from quantlab.quant.forms.codebook.tensor import quantize_codebook
from quantlab.quant.forms.float8.kernel import FP8CPUKernel
from quantlab.quant.forms.float8.tensor import quantize_fp8
from quantlab.quant.kernels.base import DequantKernel


def _weight(out: int = 48, n_in: int = 576) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _act_order(bits: int, group_size: int):
    w = _weight(n_in=512)
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(2)) * torch.linspace(0.1, 3, 512)
    return gptq_quantize(w, x.T @ x, bits, group_size, act_order=True)


CASES = {
    "int4-g128-tail": (lambda: quantize_tensor(_weight(), 4, 128), [Int4CPUKernel, BitplaneCPUKernel]),
    "int4-g32-sym": (lambda: quantize_tensor(_weight(), 4, 32, symmetric=True), [Int4CPUKernel, BitplaneCPUKernel]),
    "int4-pc": (lambda: quantize_tensor(_weight(), 4, None), [Int4CPUKernel, BitplaneCPUKernel]),
    "int4-act-order": (lambda: _act_order(4, 64), [Int4CPUKernel, BitplaneCPUKernel]),
    "hqq4-g64": (lambda: quantize_float_zero(_weight(), 4, 64, optimize=True), [Int4CPUKernel, BitplaneCPUKernel]),
    "int3-g64": (lambda: quantize_tensor(_weight(), 3, 64), [BitplaneCPUKernel]),
    "int8-pc": (lambda: quantize_tensor(_weight(), 8, None), [Int8Kernel, BitplaneCPUKernel]),
    "int8-pc-sym": (lambda: quantize_tensor(_weight(), 8, None, symmetric=True), [Int8Kernel]),
    "nf4-dq": (lambda: quantize_codebook(_weight(), "nf4", 64, double_quant=True), [Lut4CPUKernel]),
    "fp4": (lambda: quantize_codebook(_weight(), "fp4", 64), [Lut4CPUKernel]),
    "fp8-e4m3": (lambda: quantize_fp8(_weight(), "e4m3"), [FP8CPUKernel]),
}
PAIRS = [(name, cls) for name, (_, classes) in CASES.items() for cls in [*classes, DequantKernel]]


@pytest.mark.parametrize("name,cls", PAIRS, ids=[f"{n}-{c.path}" for n, c in PAIRS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stored_form_is_the_one_the_kernel_multiplies_by(name, cls, dtype) -> None:
    q = CASES[name][0]()
    if cls is not DequantKernel and not cls.supports(q, torch.device("cpu"), dtype):
        pytest.skip(f"{cls.path} does not take {name} with {dtype} activations")
    kernel = DequantKernel(q) if cls is DequantKernel else cls(q, dtype)
    back = kernel.stored()
    assert type(back) is type(q) and back.shape == q.shape
    if hasattr(q, "codes"):
        assert torch.equal(back.codes(), q.codes())
    if getattr(q, "g_idx", None) is not None:
        assert torch.equal(back.g_idx, q.g_idx)
    # The numbers measured: the kernel's own dequantization, to the precision of its parameters' dtype.
    expected = kernel.dequantize(torch.float32)
    tol = 1e-6 if kernel_keeps_parameters(cls) or dtype == torch.float32 else 1e-2
    assert (back.dequantize(torch.float32) - expected).abs().max() <= tol * expected.abs().max()
    if kernel_keeps_parameters(cls):  # the kernel holds the parameters as they were: the tensors come back bitwise
        for field, t in q.tensors().items():
            assert torch.equal(_bits(back.tensors()[field]), _bits(t)), field


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def kernel_keeps_parameters(cls) -> bool:
    return cls in (DequantKernel, BitplaneCPUKernel, Lut4CPUKernel, FP8CPUKernel)


def test_int4_kernel_zero_points_are_the_integers_quantized() -> None:
    q = quantize_tensor(_weight(), 4, 64)
    back = Int4CPUKernel(q, torch.bfloat16).stored()
    assert torch.equal(back.zero_points(), q.zero_points())
    assert torch.equal(back.scales, q.scales.to(torch.bfloat16))  # the kernel's bf16 scales, as measured
