"""KV caches in the microscaling forms and the Hadamard rotation of quantized caches: the stored rows are the
weight forms' own rounding of each head, the static layers give the dynamic layers' logits at every step (rotated
or not), the bytes equal the formula, the rotation is its own inverse and lowers the error where a channel is an
outlier, and what cannot apply is refused before a run."""
import pytest
import torch

from quantlab.extend import KV_FORMATS
from quantlab.kv.code_attention import reads_codes
from quantlab.kv.packed import Codec, hadamard_rotate
from quantlab.kv.static import CodeStore
from quantlab.quant.forms.microscaling import quantize_mx, quantize_nvfp4
from tests.kv.test_static import PROMPT, STEPS, stepwise_logits, tiny

CPU = torch.device("cpu")


def test_the_rotation_is_orthonormal_and_its_own_inverse() -> None:
    x = torch.randn(2, 3, 5, 128)
    y = hadamard_rotate(x)
    assert torch.allclose(hadamard_rotate(y), x, atol=1e-5)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    assert not torch.allclose(y, x)


def _ggml_gen_hadamard(n: int) -> torch.Tensor:
    """llama.cpp's rotation matrix (src/llama-kv-cache.cpp, ggml_gen_hadamard, llama-cpp-python 0.3.36), transcribed."""
    data = torch.zeros(n, n)
    data[0, 0] = 1.0 / n ** 0.5
    s = 1
    while s < n:
        block = data[:s, :s].clone()
        data[s:2 * s, :s], data[:s, s:2 * s], data[s:2 * s, s:2 * s] = block, block, -block
        s *= 2
    return data


@pytest.mark.parametrize("head_dim,key_block", [(64, 64), (128, 128), (192, 64), (256, 256)])
def test_keys_rotate_in_the_largest_power_of_two_block_and_values_in_blocks_of_64_as_llama_cpp(head_dim: int,
                                                                                          key_block: int) -> None:
    # llama_kv_cache::build_input_k_rot doubles nrot from 64 while it divides the head; build_input_v_rot keeps 64
    key, value, _ = KV_FORMATS["int4"].build(group_size=32, rotate="hadamard").codecs()
    x = torch.randn(1, 2, 3, head_dim)

    def blockwise(n: int) -> torch.Tensor:
        return (x.reshape(1, 2, 3, head_dim // n, n) @ _ggml_gen_hadamard(n)).reshape(x.shape)

    assert torch.allclose(key.rotation(x), blockwise(key_block), atol=1e-6)
    assert torch.allclose(value.rotation(x), blockwise(64), atol=1e-6)


@pytest.mark.parametrize("element", ["nvfp4", "mxfp4", "mxfp8"])
def test_a_stored_row_is_the_weight_forms_rounding_of_that_head(element: str) -> None:
    x = torch.randn(1, 2, 3, 64)
    rows = x.reshape(6, 64)
    expected = (quantize_nvfp4(rows, global_scale=torch.ones(1)) if element == "nvfp4" else
                quantize_mx(rows, "e2m1" if element == "mxfp4" else "e4m3")).dequantize()
    assert torch.equal(Codec(element=element).encode(x).dequantize(torch.float32), expected.reshape(x.shape))
    store = CodeStore(Codec(element=element), 1, 2, 3, 64, CPU)
    assert torch.equal(store.roundtrip(x), expected.reshape(x.shape))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("name,fields", [("int4", dict(group_size=32, residual_tokens=3, rotate="hadamard")),
                                         ("fp8", dict(rotate="hadamard")), ("nvfp4", dict(rotate="hadamard")),
                                         ("mxfp4", dict(residual_tokens=5, rotate="hadamard"))])
def test_rotated_static_layers_give_the_dynamic_layers_logits(arch: str, name: str, fields: dict) -> None:
    model, kv = tiny(arch, head_dim=64), KV_FORMATS[name].build(**fields)
    dynamic, dynamic_bytes = stepwise_logits(model, kv, None)
    static, nbytes = stepwise_logits(model, kv, PROMPT + STEPS)
    for step, (d, s) in enumerate(zip(dynamic, static)):
        assert torch.allclose(s, d, atol=1e-5, rtol=1e-5), (step, (s - d).abs().max())
    assert nbytes == kv.cache_bytes_analytic(model.config, 1, PROMPT + STEPS, torch.float32, static=True)
    assert dynamic_bytes == kv.cache_bytes_analytic(model.config, 1, PROMPT + STEPS + 1, torch.float32) or \
        dynamic_bytes == kv.cache_bytes_analytic(model.config, 1, PROMPT + STEPS, torch.float32)


OUTLIER_GAIN = [  # codec, whether rotating lowers the error of heads with a 30x outlier channel (measured ratios)
    (Codec(bits=4, group_size=32), True),  # 0.28: the outlier no longer sets its group's step
    (Codec(bits=8, group_size=64), True),  # 0.12
    (Codec(element="mxfp4"), True),  # 0.39
    (Codec(element="mxfp8"), True),  # 0.46
    (Codec(element="nvfp4"), False),  # 1.9: blocks of 16 with e4m3 scales already isolate it; rotating spreads it
    (Codec(dtype=torch.float8_e4m3fn), False),  # 15: a float's error is relative, and rotating makes small values big
]


@pytest.mark.parametrize("codec,lowers", OUTLIER_GAIN)
def test_the_rotation_lowers_the_error_of_integer_and_mx_heads_with_an_outlier_channel(codec: Codec, lowers: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 256, 64, generator=g)
    gauss = torch.randn(1, 4, 256, 64, generator=g)
    x[..., 7] *= 30  # keys' outlier channels, as RoPE'd keys have them
    rotated_codec = Codec(**{**codec.__dict__, "rotate": True})

    def ratio(t: torch.Tensor) -> float:
        plain = codec.encode(t).dequantize(torch.float32)
        rotated = rotated_codec.encode(t).dequantize(torch.float32)
        return ((rotated - t).pow(2).mean() / (plain - t).pow(2).mean()).item()

    assert (ratio(x) < 0.5) if lowers else (ratio(x) > 1.2)
    assert 0.95 < ratio(gauss) < 1.06  # without outliers it neither helps nor hurts


def test_labels_and_refusals() -> None:
    assert KV_FORMATS["nvfp4"].build(rotate="hadamard").label == "nvfp4-rot"
    assert KV_FORMATS["mxfp4"].build(residual_tokens=16).label == "mxfp4-r16"
    assert KV_FORMATS["int4"].build(group_size=32, residual_tokens=0, rotate="hadamard").label == "int4-g32-r0-rot"
    with pytest.raises(ValueError, match="rotate is for quantized caches"):
        KV_FORMATS["bf16"].build(rotate="hadamard")
    config = tiny("llama").config  # heads of 32
    assert "multiple of 64" in KV_FORMATS["int4"].build(group_size=32, rotate="hadamard").check(config)
    assert KV_FORMATS["mxfp4"].build().check(config) is None
    store = CodeStore(Codec(bits=4, group_size=32, rotate=True), 1, 1, 4, 64, CPU)
    assert reads_codes(store)  # the C attention rotates the query and the weighted sum instead
    channel = CodeStore(Codec(bits=2, axis="channel", group_size=4, rotate=True), 1, 1, 4, 64, CPU)
    assert reads_codes(channel)  # keys per channel too: the query is rotated as the keys were
