import copy

import pytest
import torch

from conftest import make_llama, rel_error
from quantlab import quantize_, quantize_tensor
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.forms.affine.float_zero import FloatZeroTensor, quantize_float_zero
from quantlab.quant.kernels.base import DequantKernel, choose_kernel

CPU = torch.device("cpu")


def _weight(out: int = 128, n_in: int = 512) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


@pytest.mark.parametrize("bits,group_size", [(4, 64), (3, 128), (2, 32), (4, None)])
def test_hqq_equals_the_hqq_librarys_quantizer(bits: int, group_size: int | None) -> None:
    quantizer = pytest.importorskip("hqq.core.quantize").Quantizer
    w = _weight()
    codes, meta = quantizer.quantize(w, nbits=bits, group_size=group_size, optimize=True, axis=1, bitpack=False,
                                     device="cpu")
    q = quantize_float_zero(w, bits, group_size, optimize=True, scale_dtype=torch.float32)
    assert torch.equal(q.codes(), codes.reshape(w.shape).to(torch.uint8))
    assert torch.allclose(q.zeros, meta["zero"].reshape(q.zeros.shape), rtol=1e-6, atol=1e-6)
    assert torch.allclose(q.scales, meta["scale"].reshape(q.scales.shape), rtol=1e-6)
    theirs = quantizer.dequantize(codes, meta).reshape(w.shape)
    assert rel_error(q.dequantize(), theirs) < 1e-6


@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 128), (3, 64), (2, 32)])
def test_the_hqq_format_equals_hqqlinear_with_its_base_quantize_config(bits: int, group_size: int) -> None:
    """HQQ's standard entry point (round_zero at 4 bits, as BaseQuantizeConfig sets it) gives the same weights."""
    hqq = pytest.importorskip("hqq.core.quantize")
    linear = torch.nn.Linear(512, 128, bias=False)
    linear.weight.data = _weight()
    theirs = hqq.HQQLinear(copy.deepcopy(linear), quant_config=hqq.BaseQuantizeConfig(nbits=bits, group_size=group_size),
                           compute_dtype=torch.float32, device="cpu").dequantize()
    fmt = WEIGHT_FORMATS["hqq"].build(bits=bits, group_size=group_size, scale_dtype="float32")
    assert fmt.round_zero == (bits == 4)
    ours = fmt.quantize_module("w", linear).kernel.dequantize(torch.float32)  # the layer the format builds
    assert rel_error(ours, theirs.reshape(128, 512)) < 1e-6
    plain = quantize_float_zero(_weight(), bits, group_size, optimize=True, scale_dtype=torch.float32)
    if bits == 4:  # the unrounded start is another solve (the library's Quantizer with round_zero=False)
        assert rel_error(plain.dequantize(), theirs.reshape(128, 512)) > 1e-4


def test_round_zero_is_a_field_resolved_into_the_config_and_named_when_not_the_librarys_default() -> None:
    assert WEIGHT_FORMATS["hqq"].build() == WEIGHT_FORMATS["hqq"].build(bits=4)  # HQQ's own default width
    assert WEIGHT_FORMATS["hqq"].build(bits=4).round_zero is True
    assert WEIGHT_FORMATS["hqq"].build(bits=3).round_zero is False
    assert WEIGHT_FORMATS["hqq"].build(bits=4).label == "hqq4-g64"
    assert WEIGHT_FORMATS["hqq"].build(bits=4, round_zero=False).label == "hqq4-g64-norz"
    assert WEIGHT_FORMATS["hqq"].build(bits=3, round_zero=True).label == "hqq3-g64-rz"
    dumped = WEIGHT_FORMATS["hqq"].build(bits=4).model_dump(mode="json", exclude_defaults=True)
    assert dumped["round_zero"] is True  # part of the variant key: a record of the old default is not reused


def test_float_zero_points_fit_the_range_and_beat_integer_ones() -> None:
    w = _weight()
    floating = quantize_float_zero(w, 4, 128)
    integer = quantize_tensor(w, 4, 128)
    # Each group's minimum and maximum are codes 0 and 15 exactly (up to fp16 storage of scale and zero).
    groups = floating.dequantize().reshape(128, 4, 128)
    original = w.reshape(128, 4, 128)
    assert torch.allclose(groups.amin(-1), original.amin(-1), atol=2e-4)
    assert torch.allclose(groups.amax(-1), original.amax(-1), atol=2e-4)
    assert rel_error(floating.dequantize(), w) < rel_error(integer.dequantize(), w)  # no range spent on reaching 0
    # HQQ's solve lowers the error further.
    assert rel_error(quantize_float_zero(w, 4, 128, optimize=True).dequantize(), w) < rel_error(floating.dequantize(), w)


def test_bytes_class_and_kernel() -> None:
    q = quantize_float_zero(_weight(), 3, 64, optimize=True)
    assert q.nbytes == q.layout_nbytes() == 128 * 512 * 3 // 8 + 2 * 128 * 8 * 2
    assert type(q.to("cpu")) is FloatZeroTensor
    assert torch.equal(q.dequantize(rows=slice(5, 9)), q.dequantize()[5:9])
    assert choose_kernel(q, CPU, torch.bfloat16).path == "bitplane_cpu"  # auto; the fallback when named:
    kernel = choose_kernel(q, CPU, torch.bfloat16, ["dequantize+matmul"])
    assert isinstance(kernel, DequantKernel) and type(kernel.qtensor) is FloatZeroTensor
    x = torch.randn(2, 512)
    assert rel_error(kernel(x), x @ q.dequantize().T) < 1e-6


def test_formats_labels_and_refusals() -> None:
    assert WEIGHT_FORMATS["hqq"].build(bits=4).label == "hqq4-g64"
    assert WEIGHT_FORMATS["int4"].build(group_size=128, zero_point="float").label == "int4-g128-asym-fz"
    with pytest.raises(ValueError, match="zero_point: float"):
        WEIGHT_FORMATS["int4"].build(symmetric=True, zero_point="float")
    with pytest.raises(ValueError, match="integer zero points"):
        WEIGHT_FORMATS["gptq"].build(bits=4, zero_point="float")
    with pytest.raises(ValueError, match="symmetric"):
        WEIGHT_FORMATS["hqq"].build(bits=4, symmetric=True)
    fmt = WEIGHT_FORMATS["hqq"].build(bits=3, group_size=64)
    assert fmt.linear_weight_bytes(128, 512, torch.float32) == quantize_float_zero(_weight(), 3, 64).nbytes


def test_hqq_on_a_model_loses_more_with_fewer_bits() -> None:
    ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(0))
    errors = {}
    for bits in (4, 3, 2):
        model, reference = make_llama(), make_llama()
        assert len(quantize_(model, WEIGHT_FORMATS["hqq"].build(bits=bits)).replaced) == 14
        with torch.no_grad():
            errors[bits] = rel_error(model(ids).logits, reference(ids).logits)
    assert errors[4] < errors[3] < errors[2]
