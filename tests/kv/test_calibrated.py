"""FP8 KV caches with static scales calibrated on text (``{format: fp8, scales: head | layer}``): the scales are
max|x| / 448 of what each layer's cache receives, the codes equal compressed-tensors' attn_head / tensor
quantization bit for bit, no scale is stored per position, and the static layers give the dynamic layers'
logits."""
import pytest
import torch

from quantlab.errors import UnsupportedError
from quantlab.extend import KV_FORMATS
from quantlab.kv.packed import encode_head_scaled

from .test_static import stepwise_logits, tiny


def _samples(n: int = 3, seq: int = 40) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (1, seq), generator=g) for _ in range(n)]


def test_scales_are_the_largest_magnitude_each_head_of_each_layer_stores_over_448() -> None:
    from transformers import DynamicCache

    model, samples = tiny("llama", head_dim=64), _samples()
    kv = KV_FORMATS["fp8"].build(scales="head").calibrated(model, samples, "random tokens")
    layer = KV_FORMATS["fp8"].build(scales="layer").calibrated(model, samples)
    maxima = None
    for ids in samples:  # the keys after the rotary embedding, as a plain cache holds them
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids, past_key_values=cache, use_cache=True)
        seen = [[x.abs().amax(dim=(0, 2, 3)) for x in (lay.keys, lay.values)] for lay in cache.layers]
        maxima = seen if maxima is None else [[torch.maximum(a, b) for a, b in zip(m, s)] for m, s in zip(maxima, seen)]
    for i, (k_max, v_max) in enumerate(maxima):
        key, value, residual = kv.layer_codecs(i)
        assert residual == 0
        assert key.head_scale == pytest.approx(tuple((k_max / 448).tolist()), rel=1e-6)
        assert value.head_scale == pytest.approx(tuple((v_max / 448).tolist()), rel=1e-6)
        assert len(set(layer.layer_codecs(i)[0].head_scale)) == 1  # per layer: every head shares the largest
        assert layer.layer_codecs(i)[0].head_scale[0] == pytest.approx(float(k_max.max() / 448), rel=1e-6)
    assert "per KV head" in kv.calibration() and "120 tokens of random tokens" in kv.calibration()
    assert kv.label == "fp8-head" and layer.label == "fp8-layer"


@pytest.mark.parametrize("strategy", ["attn_head", "tensor"])
def test_codes_equal_compressed_tensors_kv_quantization_bit_for_bit(strategy: str) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 50, 64, generator=g) * torch.tensor([1.0, 10.0, 0.1]).view(1, 3, 1, 1)
    amax = x.abs().amax(dim=(0, 2, 3)) if strategy == "attn_head" else x.abs().amax().expand(3)
    scales = amax / 448
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True)
    for states in (x, 3 * x):  # 3x: past the calibrated maximum, both saturate at 448
        shape = (3, 1, 1) if strategy == "attn_head" else (1,)
        reference = quantize(states[0], scales[: shape[0]].reshape(shape), torch.zeros(shape), args,
                             dtype=torch.float8_e4m3fn)
        codes = encode_head_scaled(states, tuple(scales.tolist()))
        assert torch.equal(codes[0].view(torch.uint8), reference.view(torch.uint8))
    assert codes.float().abs().max() == 448 and codes.float().isfinite().all()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("fields", [dict(scales="head"), dict(scales="layer"), dict(scales="head", rotate="hadamard")])
def test_static_layers_give_the_dynamic_layers_logits_and_bytes_hold_no_per_position_scale(arch: str,
                                                                                        fields: dict) -> None:
    model = tiny(arch, head_dim=64)
    kv = KV_FORMATS["fp8"].build(**fields).calibrated(model, _samples())
    dynamic, dynamic_bytes = stepwise_logits(model, kv, None)
    static, static_bytes = stepwise_logits(model, kv, 25)
    for step, (d, s) in enumerate(zip(dynamic, static)):
        assert torch.allclose(s, d, atol=1e-5, rtol=1e-5), (step, (s - d).abs().max())
    assert static_bytes == kv.cache_bytes_analytic(model.config, 1, 25, torch.float32, static=True)
    assert dynamic_bytes == kv.cache_bytes_analytic(model.config, 1, 25, torch.float32)
    bf16 = KV_FORMATS["bf16"].build().cache_bytes_analytic(model.config, 1, 25, torch.float32)
    per_position = KV_FORMATS["fp8"].build().cache_bytes_analytic(model.config, 1, 25, torch.float32)
    assert 2 * dynamic_bytes == bf16 < 2 * per_position  # one byte a value, nothing more


def test_calibrated_scales_keep_the_logits_near_the_unquantized_cache() -> None:
    model = tiny("llama", head_dim=64)
    reference, _ = stepwise_logits(model, KV_FORMATS["native"].build(), None)
    for fields in (dict(scales="head"), dict(scales="layer"), {}):
        kv = KV_FORMATS["fp8"].build(**fields)
        kv = kv.calibrated(model, _samples())
        logits, _ = stepwise_logits(model, kv, None)
        error = max((a - b).abs().max().item() for a, b in zip(logits, reference))
        assert 0 < error < 0.05, (fields, error)


def test_an_uncalibrated_static_format_refuses_to_make_a_cache_and_others_refuse_the_field() -> None:
    model = tiny("llama")
    with pytest.raises(UnsupportedError, match="calibrate it first"):
        KV_FORMATS["fp8"].build(scales="head").make_cache(model.config)
    with pytest.raises(ValueError, match="scales is for fp8"):
        KV_FORMATS["bf16"].build(scales="head")
    assert not KV_FORMATS["fp8"].build().calibrates and KV_FORMATS["fp8"].build(scales="layer").calibrates
