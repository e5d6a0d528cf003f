import pytest
import torch

from conftest import make_llama, rel_error
from quantlab import quantize_
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.forms.float8.tensor import Float8Tensor, quantize_fp8
from quantlab.quant.kernels.base import DequantKernel, choose_kernel

CPU = torch.device("cpu")


def _weight(out: int = 96, n_in: int = 256) -> torch.Tensor:
    w = torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05
    w[3] = 0  # an all-zero row keeps scale 1
    return w


@pytest.mark.parametrize("kind,dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_numerics_are_a_direct_float8_cast_of_the_scaled_weight(kind: str, dtype: torch.dtype, per_tensor: bool) -> None:
    w = _weight()
    q = quantize_fp8(w, kind, per_tensor)
    amax = w.abs().amax().reshape(1, 1) if per_tensor else w.abs().amax(1, keepdim=True)
    scales = torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))
    assert torch.equal(q.scales, scales)
    assert torch.equal(q.data.view(torch.uint8), (w / scales).to(dtype).view(torch.uint8))
    assert torch.equal(q.dequantize(), (w / scales).to(dtype).float() * scales)
    assert q.data.abs().float().amax() == torch.finfo(dtype).max  # the largest weight maps onto the format's max
    assert rel_error(q.dequantize(), w) < (0.04 if kind == "e4m3" else 0.08)


def test_bytes_and_the_class_survive_the_kernel() -> None:
    q = quantize_fp8(_weight(), "e4m3")
    assert q.nbytes == q.layout_nbytes() == 96 * 256 + 4 * 96
    assert quantize_fp8(_weight(), per_tensor=True).nbytes == 96 * 256 + 4
    assert choose_kernel(q, CPU, torch.bfloat16).path == "fp8_cpu"  # auto on CPU; the fallback when named:
    kernel = choose_kernel(q, CPU, torch.bfloat16, ["dequantize+matmul"])
    assert isinstance(kernel, DequantKernel) and type(kernel.qtensor) is Float8Tensor
    assert torch.equal(kernel.dequantize(), q.dequantize())
    assert type(q.to("cpu")) is Float8Tensor
    x = torch.randn(2, 256)
    assert rel_error(kernel(x), x @ q.dequantize().T) < 1e-6


def test_e4m3_is_closer_than_e5m2_on_a_model() -> None:
    errors = {}
    ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(0))
    for kind in ("e4m3", "e5m2"):
        model, reference = make_llama(), make_llama()
        fmt = WEIGHT_FORMATS["fp8"].build(kind=kind)
        assert len(quantize_(model, fmt).replaced) == 14 and fmt.label == f"fp8-{kind}-pc"
        with torch.no_grad():
            errors[kind] = rel_error(model(ids).logits, reference(ids).logits)
    assert errors["e4m3"] < errors["e5m2"] < 0.1


def test_the_scaled_mm_path_is_never_automatic_and_needs_a_cuda_fp8_device() -> None:
    q = quantize_fp8(_weight(96, 256))
    assert choose_kernel(q, CPU, torch.bfloat16).path == "fp8_cpu"  # weight only: activations keep their dtype
    from quantlab import UnsupportedError

    with pytest.raises(UnsupportedError, match="fp8_scaled_mm_cuda"):
        choose_kernel(q, CPU, torch.bfloat16, ["fp8_scaled_mm_cuda"])
    fmt = WEIGHT_FORMATS["fp8"].build(kernel="fp8_scaled_mm_cuda", compute_dtype="bfloat16")
    assert fmt.label == "fp8-e4m3-pc-bf16-fp8_scaled_mm_cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("per_tensor", [False, True])
def test_scaled_mm_on_cuda_agrees_with_the_dequantized_weight(per_tensor: bool) -> None:
    from quantlab.quant.forms.float8.kernel import FP8ScaledMMKernel

    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability 8.9+")
    q = quantize_fp8(_weight(256, 1024).to(dev), per_tensor=per_tensor)
    kernel = choose_kernel(q, dev, torch.bfloat16, ["fp8_scaled_mm_cuda"])
    assert isinstance(kernel, FP8ScaledMMKernel)
    x = torch.randn(5, 1024, device=dev, dtype=torch.bfloat16)
    reference = x.float() @ q.dequantize().T
    assert rel_error(kernel(x), reference) < 0.05  # the activations' e4m3 rounding (3 mantissa bits)
    assert kernel.analytic_nbytes() == Float8Tensor.analytic_nbytes((256, 1024), per_tensor)
    torch.testing.assert_close(kernel.dequantize(), q.dequantize())
