import pytest
import torch
from torch import nn

from conftest import rel_error
from quantlab import UnsupportedError, gptq_quantize, quantize_, quantize_tensor
from quantlab.engine.memory import weight_bytes_by_component
from quantlab.quant.formats.rtn import RTNFormat
from quantlab.quant.forms.affine.bitplane import BitplaneCPUKernel
from quantlab.quant.forms.affine.gptqmodel import GPTQModelKernel
from quantlab.quant.forms.affine.torch_int import Int4CPUKernel
from quantlab.quant.kernels.base import KERNELS, DequantKernel, choose_kernel
from quantlab.quant.linear import QuantizedLinear

pytest.importorskip("gptqmodel")

CPU = torch.device("cpu")


def _weight(out: int = 128, n_in: int = 512) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _x(n_in: int = 512, rows: int = 5, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


def test_gptqmodel_is_preferred_after_torchs_own_kernels_and_before_dequantize() -> None:
    order = list(KERNELS)
    assert order.index("int8pack_mm") < order.index("gptqmodel") < order.index("dequantize+matmul")


@pytest.mark.parametrize("bits,group_size,symmetric", [
    (2, 64, False), (2, None, True), (8, 128, False), (8, None, True), (4, 128, False), (4, 32, True),
])
def test_gptqmodel_kernel_agrees_with_the_dequantized_reference(bits, group_size, symmetric) -> None:
    q = quantize_tensor(_weight(), bits, group_size, symmetric)
    kernel = choose_kernel(q, CPU, torch.bfloat16, ["gptqmodel"])
    assert isinstance(kernel, GPTQModelKernel)
    assert kernel.path.startswith("gptqmodel:") and kernel.path.endswith(kernel.implementation)
    x = _x()
    assert rel_error(kernel(x), x.float() @ q.dequantize().T) < 2e-2
    assert rel_error(kernel.dequantize(), q.dequantize()) < 2e-2
    assert kernel(torch.randn(2, 3, 512).bfloat16()).shape == (2, 3, 128)
    try:  # the GPTQ tensors GPTQModel holds, read back for export, unless its kernel repacked them
        back = kernel.stored()
    except UnsupportedError as e:
        assert "repacked" in str(e)
    else:
        assert torch.equal(back.codes(), q.codes()) and torch.equal(back.row_zero_points(), q.row_zero_points())


def test_act_order_weights_run_through_gptqmodel_with_their_g_idx() -> None:
    w, x = _weight(), _x(rows=256, dtype=torch.float32)
    q = gptq_quantize(w, 2 * x.T @ x / 256, 2, 64, act_order=True)
    assert q.g_idx is not None
    kernel = choose_kernel(q, CPU, torch.bfloat16, ["gptqmodel"])
    assert rel_error(kernel(x.bfloat16()), x @ q.dequantize().T) < 2e-2


def test_auto_leaves_gptqmodels_cpu_kernels_to_recipes_that_name_them() -> None:
    # On CPU they are slower than quantlab's paths and recompile under torch.compile; on CUDA auto may take them.
    int2 = quantize_tensor(_weight(), 2, 64)
    assert isinstance(choose_kernel(int2, CPU, torch.bfloat16), BitplaneCPUKernel)
    assert isinstance(choose_kernel(int2, CPU, torch.bfloat16, ["gptqmodel"]), GPTQModelKernel)
    assert isinstance(choose_kernel(quantize_tensor(_weight(), 4, 128), CPU, torch.bfloat16), Int4CPUKernel)
    assert not GPTQModelKernel.in_auto(CPU) and GPTQModelKernel.in_auto(torch.device("cuda"))


def test_a_candidate_that_disagrees_with_the_reference_is_rejected() -> None:
    # GPTQModel's fused CPU int4 kernel drops asymmetric zero points; the probe catches it.
    from quantlab.quant.forms.affine.gptqmodel import _candidates

    q = quantize_tensor(_weight() + 0.03, 4, 128, symmetric=False)
    fused = [c for c in _candidates(4, 128, False, False, "cpu", torch.float32) if c.__name__ == "TorchFusedLinear"]
    if not fused:
        pytest.skip("this GPTQModel offers no fused CPU int4 kernel")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("quantlab.quant.forms.affine.gptqmodel._candidates", lambda *a: tuple(fused))
        with pytest.raises(UnsupportedError, match="TorchFusedLinear \\(probe error"):
            GPTQModelKernel(q, torch.bfloat16)
        # An automatic choice passes over the rejected path to the next one.
        mp.setattr(GPTQModelKernel, "supports", classmethod(lambda cls, q, d, t: True))
        assert isinstance(choose_kernel(q, CPU, torch.float16, ["gptqmodel", "dequantize+matmul"]), DequantKernel)


def test_float32_activations_are_left_to_quantlabs_paths() -> None:
    # Some GPTQModel CPU kernels accept float32 but compute in bfloat16: not a silent substitute.
    q = quantize_tensor(_weight(), 4, 32, symmetric=True)
    assert not GPTQModelKernel.supports(q, CPU, torch.float32)


def test_gptqmodel_layers_are_counted_as_quantized_weights_and_match_their_formula() -> None:
    model = nn.Sequential(nn.Linear(512, 128, bias=False)).to(torch.bfloat16)
    q = quantize_tensor(model[0].weight.data.float(), 2, 64)
    layer = QuantizedLinear.from_linear(model[0], q, ["gptqmodel"])
    model[0] = layer
    measured = weight_bytes_by_component(model)
    assert measured["other"] == 0
    layout = {n: b for n, b in layer.kernel.module.named_buffers() if n in ("qweight", "qzeros", "scales", "g_idx")}
    assert sum(b.numel() * b.element_size() for b in layout.values()) == layer.analytic_weight_bytes()
    helpers = measured["quantized_linear"] - layer.analytic_weight_bytes()  # the kernel's own shift tables
    assert 0 <= helpers <= 256
    assert measured["quantized_linear"] < 512 * 128 * 2 / 4  # 2-bit codes: well under a quarter of bf16


def test_a_recipe_format_can_select_the_gptqmodel_kernel() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64)).to(torch.bfloat16)
    x = torch.randn(3, 256).bfloat16()
    reference = model(x).float()
    quantize_(model, RTNFormat(bits=8, group_size=64, kernel="gptqmodel"))
    assert {layer.kernel_path.split(":")[0] for layer in model.modules() if isinstance(layer, QuantizedLinear)} == {"gptqmodel"}
    assert rel_error(model(x), reference) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("symmetric", [True, False])
def test_gptqmodel_kernel_on_cuda_agrees_with_the_reference(symmetric: bool) -> None:
    dev = torch.device("cuda")
    q = quantize_tensor(_weight(256, 1024).to(dev), 4, 128, symmetric=symmetric)
    kernel = choose_kernel(q, dev, torch.float16, ["gptqmodel"])
    x = _x(1024, dtype=torch.float16).to(dev)
    assert rel_error(kernel(x), x.float() @ q.dequantize().T) < 2e-2
