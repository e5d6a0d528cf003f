"""Activation rounding (``activations:`` on a weight format): the input of each quantized linear is rounded to the
named format's grid with dynamic scales before the product; weight-only stays the default."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quantlab import quantize_
from quantlab.quant.activations import ActivationFormat, round_activations
from quantlab.quant.format import build_format
from quantlab.quant.forms.microscaling import quantize_mx, quantize_nvfp4
from quantlab.quant.linear import QuantizedLinear


def test_block_formats_round_each_token_as_the_weight_forms_round_a_row() -> None:
    x = torch.randn(3, 5, 64)
    rows = x.reshape(-1, 64)
    assert torch.equal(round_activations(x, "mxfp4"), quantize_mx(rows, "e2m1").dequantize().reshape(x.shape))
    assert torch.equal(round_activations(x, "mxfp8"), quantize_mx(rows, "e4m3").dequantize().reshape(x.shape))
    assert torch.equal(round_activations(x, "nvfp4"), quantize_nvfp4(rows).dequantize().reshape(x.shape))


def test_fp8_takes_a_scale_per_token_or_per_group() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 256, generator=g) * torch.logspace(-5, 1, 256)  # small features fall to e4m3's subnormals
    per_token = round_activations(x, "fp8")
    scale = x.abs().amax(-1, keepdim=True) / 448
    assert torch.equal(per_token, (x / scale).to(torch.float8_e4m3fn).float() * scale)
    grouped = round_activations(x, "fp8", 128)
    err = {k: (v - x).pow(2).sum().item() for k, v in (("token", per_token), ("group", grouped))}
    assert err["group"] < err["token"]  # finer scales follow the features' spread
    assert round_activations(x.bfloat16(), "fp8").dtype == torch.bfloat16


def test_a_w4a4_layer_multiplies_the_rounded_input_by_the_stored_weight() -> None:
    linear = torch.nn.Linear(64, 32, bias=True)
    model = torch.nn.Sequential(linear)
    quantize_(model, build_format({"format": "nvfp4", "activations": "nvfp4", "include": ["0"]}))
    layer = model[0]
    assert isinstance(layer, QuantizedLinear) and layer.input_rounding is not None
    x = torch.randn(2, 7, 64)
    expected = F.linear(round_activations(x, "nvfp4"), layer.dequantize_weight(), layer.bias)
    assert torch.allclose(layer(x), expected, rtol=1e-5, atol=1e-5)
    weight_only = build_format({"format": "nvfp4"})
    assert weight_only.activations is None and weight_only.label == "nvfp4"


def test_labels_name_the_activation_rounding_and_bad_settings_are_refused() -> None:
    assert build_format({"format": "nvfp4", "activations": "nvfp4"}).label == "nvfp4-anvfp4"
    assert build_format({"format": "mxfp8", "activations": "mxfp8"}).label == "mxfp8-amxfp8"
    assert build_format({"format": "fp8", "block_size": 128, "activations": {"format": "fp8", "group_size": 128}}
                        ).label == "fp8-e4m3-b128-afp8-g128"
    with pytest.raises(ValueError, match="group_size is fp8's"):
        ActivationFormat(format="nvfp4", group_size=16)
    with pytest.raises(ValueError):
        build_format({"format": "mxfp4", "activations": "int4"})
    fmt = build_format({"format": "fp8", "activations": {"format": "fp8", "group_size": 128}})
    assert fmt.check_model({"q": (64, 96)}, None, torch.float32)[0] == ".activations"
    assert fmt.exports == ("compressed-tensors",)  # its input_activations round the same way
    assert build_format({"format": "nvfp4", "activations": "nvfp4"}).exports == ()  # a static global scale there


def test_integer_formats_round_inputs_to_int8_and_formats_without_the_field_refuse_it() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g) * torch.logspace(-2, 1, 64)
    scale = x.abs().amax(-1, keepdim=True) / 127
    assert torch.equal(round_activations(x, "int8"), torch.round(x / scale).clamp(-128, 127) * scale)
    assert build_format({"format": "int8", "symmetric": True, "activations": "int8"}).label == "int8-pc-sym-aint8"
    assert build_format({"format": "int4", "group_size": 32, "activations": "int8"}).label == "int4-g32-asym-aint8"
    gptq = build_format({"format": "gptq", "bits": 4, "group_size": 32, "activations": "int8"})
    assert gptq.activations.format == "int8" and gptq.label == "int4-g32-asym-aint8-gptq"
    static = build_format({"format": "int8", "activations": {"format": "int8", "global_scale": "static"}})
    assert static.needs_calibration and static.label.endswith("aint8-static")
    with pytest.raises(ValueError):
        build_format({"format": "awq", "bits": 4, "group_size": 32, "activations": "int8"})
    with pytest.raises(ValueError, match="scale_divisor is int8's"):
        ActivationFormat(format="fp8", scale_divisor=127.5)
    assert ActivationFormat(format="int8", scale_divisor=127.5).label == "aint8-d127.5"
