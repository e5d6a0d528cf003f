"""The int8-activation product (W8A8, W4A8): exact integer sums, the emulation's numbers, the stored form given back,
chosen only for formats that round their inputs to int8, traced whole by torch.compile."""
from __future__ import annotations

import pytest
import torch

from quantlab.errors import UnsupportedError
from quantlab.quant.activations import ActivationFormat, round_activations
from quantlab.quant.forms.affine import QuantizedTensor, quantize_tensor
from quantlab.quant.forms.affine.int8_act import Int8ActivationKernel, from_q4_0_order, to_q4_0_order
from quantlab.quant.kernels.base import choose_kernel
from quantlab.quant.tensors.primitives import pack

CPU = torch.device("cpu")


def _kernel(q: QuantizedTensor) -> Int8ActivationKernel:
    try:
        return Int8ActivationKernel(q, torch.float32)
    except UnsupportedError as e:  # no C compiler on this machine
        pytest.skip(str(e))


def _reference(x: torch.Tensor, q: QuantizedTensor, divisor: float = 127.0,
               static: torch.Tensor | None = None) -> torch.Tensor:
    """The emulation: the input rounded in torch, times the dequantized weight, in float64."""
    xr = round_activations(x, "int8", global_scale=static, scale_divisor=divisor)
    return (xr.double() @ q.dequantize().double().T).float()


def test_q4_0_order_round_trips_and_puts_code_j_plus_16_in_the_high_nibble() -> None:
    codes = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = to_q4_0_order(codes)
    assert packed.shape == (3, 32) and torch.equal(from_q4_0_order(packed, 64), codes)
    assert int(packed[0, 0]) == int(codes[0, 0]) | int(codes[0, 16]) << 4


@pytest.mark.parametrize("bits,group,symmetric", [(8, None, True), (8, None, False), (8, 64, False),
                                                  (4, 32, False), (4, 32, True), (4, 128, False), (4, None, False)])
def test_the_product_equals_the_emulation_for_every_row_count(bits: int, group: int | None, symmetric: bool) -> None:
    g = torch.Generator().manual_seed(bits * 100 + (group or 0))
    w = torch.randn(96, 256, generator=g)
    q = quantize_tensor(w, bits, group, symmetric)
    k = _kernel(q)
    for m in (1, 2, 3, 4, 5, 9, 12):  # up to 8 rows the C product, beyond the dense path on rounded rows
        x = torch.randn(m, 256, generator=g) * torch.logspace(-2, 1, 256)
        rounding = ActivationFormat(format="int8").module()
        y = k.rounded_matmul(x, rounding)
        ref = _reference(x, q)
        assert torch.allclose(y, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max())), (m, float((y - ref).abs().max()))


def test_the_integer_sums_are_exact() -> None:
    """Power-of-two weight scales and integer inputs whose largest is 127 (scale 1): every product and sum is an
    integer a float32 holds, so the kernel's output is the exact value, not close to it."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(1, 256, (40, 512), generator=g, dtype=torch.uint8)  # 8-bit asymmetric, any code
    zeros = torch.randint(100, 156, (40, 1), generator=g, dtype=torch.uint8)
    q = QuantizedTensor(pack(codes, 8), torch.full((40, 1), 2.0 ** -7, dtype=torch.float16), zeros, (40, 512), 8, None)
    x = torch.randint(-127, 128, (3, 512), generator=g).float()
    x[:, 0] = 127.0
    exact = ((x.long() @ (codes.long() - zeros.long()).T).double() * 2.0 ** -7).float()
    y = _kernel(q).rounded_matmul(x, ActivationFormat(format="int8").module())
    assert torch.equal(y, exact)


def test_a_static_scale_and_compressed_tensors_divisor_are_used_as_given() -> None:
    g = torch.Generator().manual_seed(2)
    q = quantize_tensor(torch.randn(64, 128, generator=g), 4, 32, False)
    k = _kernel(q)
    x = torch.randn(2, 128, generator=g) * 4
    rounding = ActivationFormat(format="int8", scale_divisor=127.5).module()
    assert torch.allclose(k.rounded_matmul(x, rounding), _reference(x, q, 127.5), rtol=1e-5, atol=1e-4)
    static = ActivationFormat(format="int8", global_scale="static").module()
    static.input_global_scale.fill_(0.01)  # saturates the larger inputs at -128 / 127
    static.calibrated = True
    ref = _reference(x, q, static=torch.tensor([0.01]))
    assert torch.allclose(k.rounded_matmul(x, static), ref, rtol=1e-5, atol=1e-4)
    static.observing = True  # calibrating: the layer rounds in torch, the kernel does not fuse
    assert k.rounded_matmul(x, static) is None


def test_it_gives_back_the_stored_form_and_holds_its_bytes() -> None:
    for bits, group, symmetric in [(8, None, False), (4, 32, False), (4, 64, True)]:
        q = quantize_tensor(torch.randn(48, 192), bits, group, symmetric)
        k = _kernel(q)
        back = k.stored()
        assert torch.equal(back.packed, q.packed) and torch.equal(back.dequantize(), q.dequantize())
        assert k.analytic_nbytes() == q.layout_nbytes() == sum(b.numel() * b.element_size() for b in k.buffers())
        assert torch.allclose(k.rows(0, 48, torch.float32), q.dequantize(), rtol=1e-6, atol=1e-6)


def test_it_is_chosen_only_for_inputs_rounded_to_int8() -> None:
    q = quantize_tensor(torch.randn(64, 128), 8, None, True)
    _kernel(q)
    assert choose_kernel(q, CPU, torch.float32, activations="int8").path == "int8_act_cpu"
    assert choose_kernel(q, CPU, torch.float32).path != "int8_act_cpu"
    assert choose_kernel(q, CPU, torch.float32, activations="fp8").path != "int8_act_cpu"
    q3 = quantize_tensor(torch.randn(64, 128), 3, 32, False)
    assert choose_kernel(q3, CPU, torch.float32, activations="int8").path != "int8_act_cpu"  # 3-bit: emulated


def test_a_compiled_decode_step_traces_the_product_whole() -> None:
    from quantlab.quant.linear import QuantizedLinear

    lin = torch.nn.Linear(128, 64, bias=True)
    q = quantize_tensor(lin.weight.data, 4, 32, False)
    _kernel(q)
    layer = QuantizedLinear.from_linear(lin, q, input_rounding=ActivationFormat(format="int8").module())
    assert layer.kernel_path == "int8_act_cpu"
    x = torch.randn(1, 128)
    eager = layer(x)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    assert torch.allclose(eager, compiled, rtol=1e-6, atol=1e-6)
    ref = _reference(x, q) + lin.bias.data
    assert torch.allclose(eager, ref, rtol=1e-5, atol=1e-5)
