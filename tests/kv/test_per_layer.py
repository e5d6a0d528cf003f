"""A KV cache stored per layer in different formats: each layer is its own format's layer (the same logits through
the cache, the same bytes), the recipe form round-trips, and a wrong layer is refused in one line."""
import pytest
import torch

from quantlab.extend import KV_FORMATS
from quantlab.kv.format import layer_kv_bytes
from tests.conftest import make_llama

INT8 = {"format": "int8", "group_size": 32, "residual_tokens": 0}
INT4 = {"format": "int4", "group_size": 32, "residual_tokens": 8}


def _logits(model: torch.nn.Module, kv, ids: torch.Tensor) -> tuple[torch.Tensor, object]:
    """Prefill the first half of ``ids`` into a fresh cache, then feed the rest one token at a time through it."""
    cache = kv.make_cache(model.config)
    half = ids.shape[1] // 2
    with torch.no_grad():
        out = [model(input_ids=ids[:, :half], past_key_values=cache, use_cache=True).logits]
        for t in range(half, ids.shape[1]):
            out.append(model(input_ids=ids[:, t: t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, 1), cache


def _per_layer(**fields) -> object:
    return KV_FORMATS["per-layer"].build(**fields)


def test_a_layer_reads_as_its_own_format_does() -> None:
    torch.manual_seed(0)
    model = make_llama(num_hidden_layers=3).eval()
    ids = torch.randint(0, 4096, (2, 48), generator=torch.Generator().manual_seed(1))
    int8 = KV_FORMATS["int8"].build(**{k: v for k, v in INT8.items() if k != "format"})
    ref, ref_cache = _logits(model, int8, ids)
    same, cache = _logits(model, _per_layer(default=INT8, layers=[{"layers": [1], **INT8}]), ids)
    assert torch.equal(same, ref)  # every layer int8, whichever entry names it
    assert _per_layer(default=INT8, layers=[{"layers": [1], **INT8}]).cache_bytes(cache) == int8.cache_bytes(ref_cache)
    native, _ = _logits(model, KV_FORMATS["native"].build(), ids)
    mixed_kv = _per_layer(default="native", layers=[{"layers": [0, 2], **INT4}])
    mixed, cache = _logits(model, mixed_kv, ids)
    assert not torch.equal(mixed, native) and not torch.equal(mixed, ref)
    # bytes: measured equals the formula, and the formula is the layers' own formats' sum
    positions = ids.shape[1]
    assert mixed_kv.cache_bytes(cache) == mixed_kv.cache_bytes_analytic(model.config, 2, positions, torch.float32)
    int4 = KV_FORMATS["int4"].build(**{k: v for k, v in INT4.items() if k != "format"})
    native_layers = layer_kv_bytes(KV_FORMATS["native"].build(), model.config, 2, positions, torch.float32)
    int4_layers = layer_kv_bytes(int4, model.config, 2, positions, torch.float32)
    assert mixed_kv.cache_bytes_analytic(model.config, 2, positions, torch.float32) == \
        int4_layers[0] + native_layers[1] + int4_layers[2]
    assert int4_layers[0] < native_layers[1]


def test_sliding_layers_count_their_window() -> None:
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                              hidden_size=256, intermediate_size=512, sliding_window=128, vocab_size=512)
    sliding = [i for i, k in enumerate(config.layer_types) if k == "sliding_attention"]
    kv = _per_layer(default="native", layers=[{"layers": sliding, "format": "int8"}])
    native = layer_kv_bytes(KV_FORMATS["native"].build(), config, 4, 4096, torch.bfloat16)
    int8 = layer_kv_bytes(KV_FORMATS["int8"].build(), config, 4, 4096, torch.bfloat16)
    assert kv.cache_bytes_analytic(config, 4, 4096, torch.bfloat16) == \
        sum(int8[i] if i in sliding else native[i] for i in range(6))


def test_the_recipe_form_round_trips_and_names_its_layers() -> None:
    kv = _per_layer(default="native", layers=[{"layers": [0, 1, 2, 5], **INT4}, {"layers": 3, "format": "fp8"}])
    assert kv.label == "native+int4-g32-r8@L0-2,5+fp8@L3"
    assert KV_FORMATS["per-layer"].build(**kv.model_dump(mode="json")) == kv
    assert kv.format_of(5).label.startswith("int4") and kv.format_of(4).label == "native"


@pytest.mark.parametrize("fields,match", [
    ({"layers": [{"layers": [0], "format": "int8"}, {"layers": [0], "format": "int4"}]}, "named twice"),
    ({"layers": [{"layers": [0], "format": {"format": "per-layer", "layers": [{"layers": [1], "format": "int8"}]}}]},
     "cannot hold another per-layer"),
    ({"layers": [{"layers": [-1], "format": "int8"}]}, "distinct indices from 0"),
    ({"layers": []}, "at least 1"),
])
def test_wrong_layers_are_refused(fields: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _per_layer(**fields)


def test_a_layer_beyond_the_model_is_refused_before_a_run() -> None:
    kv = _per_layer(layers=[{"layers": [0, 7], "format": "int8"}])
    assert "layers [7] do not exist: the model has 2 decoder layers (0-1)" in kv.check(make_llama().config)
