"""Keys in one stored format and values in another: each side is its own format's, bit for bit and byte for byte;
the recipe form round-trips; sides that keep different recent positions, or a rotation set on the split itself,
are refused in one line."""
import pytest
import torch
from pydantic import ValidationError

from quantlab.extend import KV_FORMATS
from quantlab.kv.per_layer import build_kv_format, kv_format_entry
from tests.conftest import make_llama

INT8 = {"format": "int8", "group_size": 32, "residual_tokens": 0}
Q4 = {"format": "q4_0", "rotate": "hadamard"}


def _split(keys=INT8, values=Q4):
    return build_kv_format({"format": "split", "keys": keys, "values": values})


def test_each_side_is_stored_as_its_own_format_stores_it() -> None:
    config = make_llama(num_hidden_layers=1, hidden_size=256, num_attention_heads=4).config  # heads of 64
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(2, 2, 128, 64, generator=g) for _ in range(2))
    got_k, got_v = _split().make_cache(config).layers[0].update(k, v)
    want_k, _ = build_kv_format(INT8).make_cache(config).layers[0].update(k, v)
    _, want_v = build_kv_format(Q4).make_cache(config).layers[0].update(k, v)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not torch.equal(got_k, k) and not torch.equal(got_v, want_k)


def test_its_bytes_are_half_of_each_side_s_measured_and_by_formula() -> None:
    model = make_llama(num_hidden_layers=2, hidden_size=256, num_attention_heads=4).eval()
    split, keys, values = _split(), build_kv_format(INT8), build_kv_format(Q4)
    ids = torch.randint(0, 4096, (2, 130), generator=torch.Generator().manual_seed(1))
    cache = split.make_cache(model.config)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    by_side = [f.cache_bytes_analytic(model.config, 2, 128, torch.float32) for f in (keys, values)]
    assert split.cache_bytes_analytic(model.config, 2, 128, torch.float32) * 2 == sum(by_side)  # whole blocks
    assert split.cache_bytes(cache) == split.cache_bytes_analytic(model.config, 2, 130, torch.float32)
    assert split.serving_cache_sides()["llama.cpp"] == (("q8_0", False), ("q4_0", True))  # -ctk q8_0 -ctv q4_0


def test_the_recipe_form_round_trips() -> None:
    split = _split()
    assert split.label == "k=int8-g32-r0,v=q4_0-rot"
    assert build_kv_format(kv_format_entry(split)) == split
    assert KV_FORMATS["split"].build(keys=INT8, values=INT8).codecs() == build_kv_format(INT8).codecs()


@pytest.mark.parametrize("fields,match", [
    ({"keys": INT8, "values": {"format": "int4", "group_size": 32, "residual_tokens": 8}}, "same residual_tokens"),
    ({"keys": INT8, "values": Q4, "rotate": "hadamard"}, "set it on keys or values"),
    ({"keys": "native", "values": Q4}, "a side of a split cache is a stored format"),
])
def test_sides_that_cannot_pair_are_refused(fields: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        KV_FORMATS["split"].build(**fields)
