"""KV caches in llama.cpp's block types (q8_0, q4_0): each stored head is ggml's own quantizer's bytes (the vendored
ggml and gguf-py), the bytes are llama.cpp's (34 and 18 per 32 values), the static layers give the dynamic layers'
logits rotated or not, and the llama.cpp engine runs them as its cache types."""
import numpy as np
import pytest
import torch

from quantlab.extend import KV_FORMATS
from quantlab.kv.ggml_rows import quantize_rows
from quantlab.kv.packed import Codec

from .test_static import stepwise_logits, tiny


def _hard_rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g) * torch.logspace(-3, 2, 64).unsqueeze(1)
    x[0, :32] = 0  # an all-zero block: scale 0, codes 0 (q4_0: 8)
    x[1, 5] = -2 * x[1].abs().max()  # the largest magnitude negative: q4_0's -8 is on the other side
    x[2] = 0.5  # ties
    x[3, :32] = torch.arange(32) * 0.5
    return x


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_stored_blocks_are_ggmls_quantizer_bytes(kind: str) -> None:
    import gguf

    from quantlab.quant.forms.ggml.kernel import dequantize_blocks, quantize_blocks

    x = _hard_rows()
    rows = quantize_rows(x, kind)
    blocks = torch.cat([rows.scales.view(torch.uint8).reshape(64, 4, 2),
                        rows.codes.view(torch.uint8).reshape(64, 4, -1)], -1).reshape(64, -1)
    assert torch.equal(blocks, quantize_blocks(x, kind.upper()))  # the vendored ggml's quantize_row_*_ref
    assert np.array_equal(blocks.numpy(), gguf.quants.quantize(x.numpy(), getattr(gguf.GGMLQuantizationType, kind.upper())))
    assert torch.equal(rows.dequantize(), dequantize_blocks(blocks, kind.upper(), 128))
    assert blocks.shape[1] == 4 * (34 if kind == "q8_0" else 18)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("kind,rotate", [("q8_0", "none"), ("q4_0", "none"), ("q4_0", "hadamard"), ("q8_0", "hadamard")])
def test_static_layers_give_the_dynamic_layers_logits_and_llama_cpps_bytes(arch: str, kind: str, rotate: str) -> None:
    model = tiny(arch, head_dim=64)
    kv = KV_FORMATS[kind].build(rotate=rotate)
    dynamic, dynamic_bytes = stepwise_logits(model, kv, None)
    static, static_bytes = stepwise_logits(model, kv, 25)
    for step, (d, s) in enumerate(zip(dynamic, static)):
        assert torch.allclose(s, d, atol=1e-5, rtol=1e-5), (step, (s - d).abs().max())
    assert static_bytes == kv.cache_bytes_analytic(model.config, 1, 25, torch.float32, static=True)
    assert dynamic_bytes == kv.cache_bytes_analytic(model.config, 1, 25, torch.float32)
    values = KV_FORMATS["fp32"].build().cache_bytes_analytic(model.config, 1, 25, torch.float32) // 4
    if arch == "llama":  # every position stored: llama.cpp's bytes per value
        assert dynamic_bytes * 32 == values * (34 if kind == "q8_0" else 18)


def test_the_error_falls_with_the_rotation_where_a_channel_is_an_outlier() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 64, 64, generator=g)
    x[..., 7] *= 30
    for kind in ("q8_0", "q4_0"):
        plain, rotated = Codec(element=kind), Codec(element=kind, rotate=True)
        errors = [(c.encode(x).dequantize(torch.float32) - x).norm() for c in (plain, rotated)]
        assert errors[1] < 0.5 * errors[0], (kind, errors)


def test_the_llama_cpp_engine_runs_them_as_its_cache_types_and_refuses_what_it_has_not() -> None:
    from quantlab import validate_recipe
    from quantlab.engine import engine
    from quantlab.errors import RecipeError

    llama = engine("llama.cpp")
    assert llama.cache_type(KV_FORMATS["q4_0"].build(rotate="hadamard")) == "q4_0"
    assert llama.cache_type(KV_FORMATS["q8_0"].build()) == "q8_0"
    assert llama.cache_type(KV_FORMATS["fp8"].build(scales="head")) is None
    spec = {"name": "kv", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"], "device": "cpu",
            "workload": {"prompt_tokens": 8, "new_tokens": 4, "engine": ["auto", "llama.cpp"]},
            "evaluations": {"perplexity": {"protocol": "windows", "window_tokens": 64}}}
    assert len(validate_recipe({**spec, "kv_cache": ["native", "q8_0", "q4_0"]}).variants()) == 6
    with pytest.raises(RecipeError, match=r"kv_cache\[1\]: engine llama.cpp has no cache type for int4"):
        validate_recipe({**spec, "kv_cache": ["native", "int4"]})
    with pytest.raises(RecipeError, match="rotate: hadamard needs a head dimension that is a multiple of 64"):
        from quantlab.run.runner import run_recipe

        run_recipe(validate_recipe({**spec, "kv_cache": [{"format": "q4_0", "rotate": "hadamard"}],
                                    "workload": {"prompt_tokens": 8, "new_tokens": 4}}), None)
