"""The microscaling forms on CUDA: quantized there, the codes and scales are the CPU's (the same arithmetic on either
device, so a GPU run measures the format the CPU tests check against the references); the linears multiply through
the kernel ``auto`` picks, eager and compiled; the activation rounding is the CPU's.

One difference is CUDA's, and the references share it: CUDA divides a tensor by a Python number as a multiply by its
reciprocal, so an FP8 scale ``amax / 448`` (block FP8's, the fp8 activations') can be one ulp off the CPU's
quotient. compressed-tensors writes the same expression, so on each device quantlab's scales are the reference's
there; between devices they agree to the ulp, and a code moves where the ulp crosses a rounding boundary."""
from __future__ import annotations

import pytest
import torch

from quantlab.quant.activations import round_activations
from quantlab.quant.forms.float8.tensor import quantize_fp8
from quantlab.quant.forms.microscaling import quantize_mx, quantize_nvfp4
from quantlab.quant.kernels.base import choose_kernel

CUDA = torch.device("cuda")
FORMS = {"mxfp4": lambda w: quantize_mx(w, "e2m1"), "nvfp4": quantize_nvfp4, "mxfp8": lambda w: quantize_mx(w, "e4m3"),
         "fp8-b128": lambda w: quantize_fp8(w, block_size=128)}
pytestmark = pytest.mark.gpu


def _fields(q) -> dict[str, torch.Tensor]:
    return {name: getattr(q, name) for name in type(q).tensor_field_names()}


def _within_an_ulp(got: torch.Tensor, want: torch.Tensor) -> bool:
    """float32 tensors equal bit for bit but for one unit in the last place."""
    return bool(((got.view(torch.int32) - want.view(torch.int32)).abs() <= 1).all())


def _a_scale_ulp_apart(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Rounded values equal, or a rare few (under 1 in 10,000) one e4m3 step apart: where a scale one ulp off
    moved the quotient across a rounding boundary."""
    moved = (got - want).abs() > want.abs() * 2**-20
    step = ((got - want).abs() <= want.abs() * 0.126 + 1e-30).all()
    return bool(step) and moved.float().mean().item() < 1e-4


@pytest.mark.parametrize("form", FORMS)
def test_quantizing_on_cuda_gives_the_cpus_codes_and_scales(real_weights, form: str) -> None:
    for name, w in real_weights.items():
        on_cpu, on_cuda = _fields(FORMS[form](w)), _fields(FORMS[form](w.to(CUDA)))
        for field, want in on_cpu.items():
            got = on_cuda[field].cpu()
            assert got.dtype == want.dtype, (name, field)
            if form == "fp8-b128" and field == "scales":
                assert _within_an_ulp(got, want), name
            elif form == "fp8-b128":
                assert _a_scale_ulp_apart(got.float(), want.float()), name
            else:
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (name, field)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_the_cuda_kernel_equals_dequantize_then_matmul_eager_and_compiled(form: str, rows: int) -> None:
    w = (torch.distributions.StudentT(3.0).sample((384, 512)) * 0.02).to(CUDA)
    q = FORMS[form](w)
    kernel = choose_kernel(q, CUDA, torch.bfloat16)
    x = torch.randn(rows, 512, device=CUDA, dtype=torch.bfloat16)
    ref = x.float() @ q.dequantize().T
    for y in (kernel(x), torch.compile(kernel)(x)):
        assert y.dtype == torch.bfloat16
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2  # bf16's rounding of the output
    held = kernel.dequantize().float()
    assert ((held - q.dequantize()).norm() / q.dequantize().norm()).item() < 4e-3  # as held: at most a bf16 rounding


@pytest.mark.parametrize("fmt,group", [("nvfp4", None), ("mxfp4", None), ("mxfp8", None), ("fp8", None), ("fp8", 128)])
def test_activation_rounding_on_cuda_is_the_cpus(fmt: str, group: int | None) -> None:
    x = torch.distributions.StudentT(3.0).sample((37, 1024))
    want = round_activations(x, fmt, group)
    got = round_activations(x.to(CUDA), fmt, group).cpu()
    assert _a_scale_ulp_apart(got, want) if fmt == "fp8" else torch.equal(got, want)
