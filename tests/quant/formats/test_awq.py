"""AWQ: the scale and clip searches against AutoAWQ's own code, the folds, and the quantized layers."""
import copy

import pytest
import torch

from quantlab import UnsupportedError, quantize_
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.formats.awq import enclosing_module, fold_, fold_target, search_clip, search_scales, weight_means
from quantlab.quant.forms.affine.tensor import QuantizedTensor
from quantlab.quant.linear import QuantizedLinear
from tests.conftest import make_llama, rel_error


def _layer_call(model, tokens: int = 64, seed: int = 0):
    """A decoder layer of ``model`` and the (args, kwargs) it is called with on random tokens."""
    from quantlab.quant.calibrate.layers import _capture_first_layer_inputs, decoder_layers

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g)
    layers = decoder_layers(model)
    return layers[0], _capture_first_layer_inputs(model, layers, [ids])[0]


def _hidden(call):
    args, kwargs = call
    return kwargs.get("hidden_states", args[0] if args else None)


def _autoawq(bits: int, group_size: int, duo_scaling: bool = True):
    """AutoAWQ's quantizer object without its model plumbing: only the fields its searches read. (AutoAWQ 0.2.9,
    the last release; llm-compressor 0.14, which adopted it, pins transformers<=5.17 and pulls auto-round.)"""
    quantizer = pytest.importorskip("awq.quantize.quantizer")
    q = object.__new__(quantizer.AwqQuantizer)
    q.w_bit, q.group_size, q.zero_point, q.duo_scaling = bits, group_size, True, duo_scaling
    q.max_chunk_memory, q.n_parallel_calib_samples = 1 << 30, None
    return q


def _restorable(module: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """AutoAWQ restores the weights after each grid step from ``state_dict()`` moved ``.cpu()``, a copy only when
    the module is on a GPU: on CPU its in-place scaling would reach the saved weights. Give it copies."""
    monkeypatch.setattr(module, "state_dict", lambda *a, **k: {n: t.clone() for n, t in
                                                                torch.nn.Module.state_dict(module, *a, **k).items()})


def _mlp_input(layer, call):
    seen = []
    handle = layer.mlp.gate_proj.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    layer(*call[0], **call[1])
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("duo_scaling", [True, False])
def test_scale_search_chooses_autoawqs_scales_for_the_mlp(duo_scaling: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_llama(hidden_size=128, intermediate_size=256)
    layer, call = _layer_call(model)
    x = _mlp_input(layer, call)
    awq = _autoawq(3, 64, duo_scaling)
    _restorable(layer.mlp, monkeypatch)
    _, _, theirs = awq._search_best_scale(layer, layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj],
                                          x, module2inspect=layer.mlp)
    x_mean = x.abs().reshape(-1, x.shape[-1]).mean(dim=0)
    ours, found = search_scales([layer.mlp.gate_proj, layer.mlp.up_proj], layer.mlp, [((x,), {})], x_mean,
                                lambda w: awq.pseudo_quantize_tensor(w)[0], 64, duo_scaling=duo_scaling)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert found["output_error_awq"] <= found["output_error_rtn"]


def test_scale_search_chooses_autoawqs_scales_for_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_llama(hidden_size=128, intermediate_size=256)
    layer, (args, kwargs) = _layer_call(model)
    hidden = _hidden((args, kwargs))
    x = layer.input_layernorm(hidden)
    attn_kwargs = {"position_embeddings": kwargs["position_embeddings"], "attention_mask": kwargs.get("attention_mask")}
    awq = _autoawq(4, 32)
    _restorable(layer.self_attn, monkeypatch)
    projections = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]
    _, _, theirs = awq._search_best_scale(layer, layer.input_layernorm, projections, x,
                                          module2inspect=layer.self_attn, kwargs=attn_kwargs)
    x_mean = x.abs().reshape(-1, x.shape[-1]).mean(dim=0)
    ours, _ = search_scales(projections, layer.self_attn, [((), {"hidden_states": x, **attn_kwargs})], x_mean,
                            lambda w: awq.pseudo_quantize_tensor(w)[0], 32)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_scale_search_leaves_the_weights_as_they_were() -> None:
    model = make_llama()
    layer, call = _layer_call(model)
    x = _mlp_input(layer, call)
    before = layer.mlp.down_proj.weight.clone()
    act = layer.mlp.act_fn(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x)
    search_scales([layer.mlp.down_proj], layer.mlp.down_proj, [((act,), {})], act.abs().mean(dim=(0, 1)),
                  WEIGHT_FORMATS["awq"].build(bits=3, group_size=64).pseudo_quantize, 64, grid=4)
    assert torch.equal(layer.mlp.down_proj.weight, before)


@pytest.mark.parametrize("group_size", [64, 128])
def test_clip_search_matches_autoawq(group_size: int) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(128, 256, generator=g) * 0.02
    w[:, :8] *= 6  # a few wide columns, so shrinking the range pays somewhere
    x = torch.randn(2048, 256, generator=g)
    awq = _autoawq(3, group_size)
    theirs = awq._compute_best_clip(w, x).squeeze(-1)
    ours = search_clip(w, x, group_size, lambda t: awq.pseudo_quantize_tensor(t)[0])
    assert ours.shape == (128, 256 // group_size)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert (ours < w.abs().reshape(128, -1, group_size).amax(-1)).any()


def test_weight_means_are_group_normalized_magnitudes() -> None:
    w = torch.tensor([[1.0, -2.0, 4.0, 0.0], [0.5, 0.5, -1.0, 1.0]])
    # groups of 2: row 0 -> [0.5, 1] [1, 0]; row 1 -> [1, 1] [1, 1]
    torch.testing.assert_close(weight_means([w], 2), torch.tensor([0.75, 1.0, 1.0, 0.5]), rtol=1e-5, atol=1e-5)
    assert weight_means([w], None)[1] == pytest.approx((0.5 + 0.5) / 2, rel=1e-5)


def test_groups_fold_into_the_norms_and_up_proj_and_o_proj_keeps_an_input_scale_under_gqa() -> None:
    layer, call = _layer_call(make_llama(num_attention_heads=4, num_key_value_heads=2))
    assert fold_target(layer, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], call) == "input_layernorm"
    assert fold_target(layer, ["self_attn.o_proj"], call) is None  # v has 64 channels, o reads 128
    assert fold_target(layer, ["mlp.gate_proj", "mlp.up_proj"], call) == "post_attention_layernorm"
    assert fold_target(layer, ["mlp.down_proj"], call) == "mlp.up_proj"  # not gate_proj: silu is not linear


def test_o_proj_folds_into_v_proj_without_gqa() -> None:
    layer, call = _layer_call(make_llama(num_attention_heads=4, num_key_value_heads=4))
    assert fold_target(layer, ["self_attn.o_proj"], call) == "self_attn.v_proj"


def test_a_fold_leaves_the_layer_output_unchanged() -> None:
    layer, (args, kwargs) = _layer_call(make_llama())
    before = layer(*args, **kwargs)[0] if isinstance(layer(*args, **kwargs), tuple) else layer(*args, **kwargs)
    g = torch.Generator().manual_seed(3)
    fold_(layer, "input_layernorm", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
          torch.rand(128, generator=g) * 3 + 0.1)
    fold_(layer, "mlp.up_proj", ["mlp.down_proj"], torch.rand(256, generator=g) * 3 + 0.1)
    out = layer(*args, **kwargs)
    after = out[0] if isinstance(out, tuple) else out
    assert rel_error(after, before) < 1e-5


def test_enclosing_module() -> None:
    assert enclosing_module(["self_attn.q_proj", "self_attn.k_proj"]) == "self_attn"
    assert enclosing_module(["mlp.down_proj"]) == "mlp.down_proj"
    assert enclosing_module(["attn.c_attn", "mlp.c_fc"]) == ""


def _calibration(model, n: int = 8, tokens: int = 64):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, model.config.vocab_size, (1, tokens), generator=g) for _ in range(n)]


def test_awq_on_a_llama_quantizes_every_linear_and_keeps_the_output_closer_than_rtn() -> None:
    model = make_llama()
    ids = _calibration(model, 1, 32)[0]
    reference = model(ids).logits
    rtn = copy.deepcopy(model)
    quantize_(rtn, WEIGHT_FORMATS["int4"].build(group_size=32))
    fmt = WEIGHT_FORMATS["awq"].build(bits=4, group_size=32)
    report = quantize_(model, fmt, _calibration(model))
    assert len(report.replaced) == 2 * 7 and fmt.label == "int4-g32-asym-awq"
    assert rel_error(model(ids).logits, reference) < 0.95 * rel_error(rtn(ids).logits, reference)
    for name in report.replaced:
        layer = model.get_submodule(name)
        assert isinstance(layer, QuantizedLinear) and layer.settings == {"method": "awq"}
        assert (layer.input_scale is not None) == name.endswith("o_proj")  # GQA: no module to fold into
        assert report.details[name]["awq_scales_in"] == ("input scale" if name.endswith("o_proj") else
                                                        {"q": "input_layernorm", "k": "input_layernorm",
                                                         "v": "input_layernorm", "o": None,
                                                         "gate": "post_attention_layernorm",
                                                         "up": "post_attention_layernorm",
                                                         "down": "mlp.up_proj"}[name.split(".")[-1].split("_")[0]])


def test_awq_on_gpt2_scales_through_conv1d_layers() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128)).eval()
    ids = _calibration(model, 1, 32)[0]
    reference = model(ids).logits
    report = quantize_(model, WEIGHT_FORMATS["awq"].build(bits=4, group_size=32), _calibration(model))
    scales_in = {n.split(".", 3)[-1]: d["awq_scales_in"] for n, d in report.details.items() if ".h.0." in n}
    assert scales_in == {"attn.c_attn": "ln_1", "attn.c_proj": "input scale", "mlp.c_fc": "ln_2",
                         "mlp.c_proj": "input scale"}  # c_proj reads gelu(c_fc(x)): no exact fold
    assert rel_error(model(ids).logits, reference) < 0.1


def test_input_scale_is_applied_counted_and_moved() -> None:
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=True)
    from quantlab import quantize_tensor

    layer = QuantizedLinear.from_linear(linear, quantize_tensor(linear.weight.data, 4, 32))
    plain_bytes = layer.analytic_weight_bytes()
    scale = torch.rand(64, generator=g) + 0.5
    layer.set_input_scale(scale, torch.float32)
    x = torch.randn(3, 64, generator=g)
    expected = x @ (layer.kernel.dequantize() * scale).T + linear.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.dequantize_weight(), layer.kernel.dequantize() * scale)
    assert layer.analytic_weight_bytes() == plain_bytes + 64 * 4
    assert "input_scale" in layer.state_dict() and layer.to(torch.float64).input_scale.dtype == torch.float64


def test_awq_settings_are_validated() -> None:
    for bad in ({"per_tensor": True}, {"clip": "mse"}, {"zero_point": "float"}):
        with pytest.raises(ValueError):
            WEIGHT_FORMATS["awq"].build(bits=4, **bad)
    assert WEIGHT_FORMATS["awq"].build(bits=3, group_size=128, search_clip=False).label == "int3-g128-asym-awq-noclip"
    fmt = WEIGHT_FORMATS["awq"].build(bits=4, group_size=128)
    assert fmt.linear_weight_bytes(256, 512, torch.float32) == QuantizedTensor.analytic_nbytes((256, 512), 4, 128, False, 2)


def test_awq_needs_calibration() -> None:
    with pytest.raises(ValueError, match="calibration"):
        quantize_(make_llama(), WEIGHT_FORMATS["awq"].build(bits=4))


def test_awq_refuses_a_dispatched_model() -> None:
    model = make_llama()
    model.hf_device_map = {"": "cpu", "lm_head": "disk"}
    with pytest.raises(UnsupportedError, match="device_map"):
        quantize_(model, WEIGHT_FORMATS["awq"].build(bits=4), _calibration(model, 2))


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_awq_beats_rtn_on_the_bundled_model_at_three_bits() -> None:
    """Output error of each group's enclosing module with only that group quantized: AWQ's scales against
    plain round-to-nearest, summed over the model (the per-group figures the format reports)."""
    from quantlab.data import calibration_samples, load_text
    from quantlab.eval.tokens import tokenize
    from quantlab.models import load_model
    from quantlab.run.recipe import ModelSpec

    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"))
    ids = tokenize(loaded.tokenizer, load_text("bundled-heldout"))
    report = quantize_(loaded.model, WEIGHT_FORMATS["awq"].build(bits=3, group_size=128, search_tokens=2048),
                       calibration_samples(ids, 8, 256, seed=0))
    groups = {(n.rsplit(".", 1)[0], d["awq_ratio"], d["output_error_rtn"]): d for n, d in report.details.items()}
    awq = sum(d["output_error_awq"] for d in groups.values())
    rtn = sum(d["output_error_rtn"] for d in groups.values())
    assert awq < 0.95 * rtn
