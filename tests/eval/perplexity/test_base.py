"""The protocol interface and the scoring the protocols share: spans, the windows protocol, recipe forms."""
import math

import pytest
import torch
import torch.nn.functional as F

from quantlab.data import Text
from quantlab.eval.perplexity.base import perplexity, window_spans
from tests.conftest import make_llama

CPU = torch.device("cpu")
TEXT = Text("test", "x")


def _ids(n: int = 1000) -> torch.Tensor:
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("n,window,stride", [(1000, 128, 64), (1000, 128, 128), (1024, 256, 100), (300, 256, 1)])
def test_sliding_spans_score_every_token_but_the_first_exactly_once(n: int, window: int, stride: int) -> None:
    spans = window_spans(n, window, stride)
    scored = [pos for begin, end, k in spans for pos in range(end - k, end)]
    if stride == window:
        assert len(scored) == len(set(scored)) and all((pos % window) != 0 for pos in scored)
    else:
        assert sorted(scored) == list(range(1, n))
    assert all(end - begin <= window and end - k > begin for begin, end, k in spans)


def test_windows_protocol_matches_a_direct_computation() -> None:
    model, ids = make_llama(), _ids(1000)
    got = perplexity(model, ids, TEXT, protocol="windows", window_tokens=128, batch_size=3, device=CPU)
    windows = ids[: 7 * 128].view(7, 128)
    with torch.no_grad():
        logits = model(windows).logits[:, :-1]
    nll = F.cross_entropy(logits.reshape(-1, 4096), windows[:, 1:].reshape(-1))
    assert got["perplexity"] == pytest.approx(math.exp(nll.item()), rel=1e-4)
    assert got["perplexity_protocol"]["scored_tokens"] == 7 * 127


def test_protocols_are_registered_configs_that_own_their_fields() -> None:
    from quantlab.extend import PERPLEXITY_PROTOCOLS, PerplexityProtocol

    assert {"windows", "sliding", "kv-chunked", "lm-eval"} <= set(PERPLEXITY_PROTOCOLS.names())
    for entry in PERPLEXITY_PROTOCOLS.entries():
        assert issubclass(entry.cls, PerplexityProtocol) and entry.cls.model_config["frozen"]
        protocol = entry.build(**({"stride_tokens": 128} if "stride_tokens" in entry.cls.model_fields else {}))
        assert protocol.name == entry.name
    assert "stride_tokens" in PERPLEXITY_PROTOCOLS["sliding"].cls.model_fields
    assert "stride_tokens" not in PERPLEXITY_PROTOCOLS["windows"].cls.model_fields
    assert "chunk_tokens" in PERPLEXITY_PROTOCOLS["kv-chunked"].cls.model_fields


@pytest.mark.parametrize("section, where, message", [
    ({"protocol": "windows", "stride_tokens": 64}, "evaluations.perplexity.stride_tokens", "unknown field 'stride_tokens'"),
    ({"protocol": "sliding", "chunk_tokens": 8, "stride_tokens": 8}, "evaluations.perplexity.chunk_tokens",
     "unknown field 'chunk_tokens'"),
    ({"protocol": "slidng"}, "evaluations.perplexity.protocol", "did you mean 'sliding'?"),
    ({"protocol": "sliding"}, "evaluations.perplexity", "stride_tokens between 1 and window_tokens"),
])
def test_a_recipe_names_the_protocol_and_its_field_in_errors(section: dict, where: str, message: str) -> None:
    from quantlab import RecipeError, validate_recipe

    with pytest.raises(RecipeError) as e:
        validate_recipe({"name": "r", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                         "evaluations": {"perplexity": section}}, "r.yaml")
    assert str(e.value).startswith(f"r.yaml: {where}") and message in str(e.value), str(e.value)


def test_the_recipe_form_round_trips_and_leaves_the_default_protocol_out_of_the_key() -> None:
    from quantlab import validate_recipe

    base = {"name": "r", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"]}
    for section in ({"protocol": "sliding", "window_tokens": 128, "stride_tokens": 32}, {"protocol": "kv-chunked"},
                    {"window_tokens": 128}):
        recipe = validate_recipe({**base, "evaluations": {"perplexity": section}})
        again = validate_recipe(recipe.to_spec())
        assert again.evaluations.perplexity == recipe.evaluations.perplexity
        assert again.variants()[0].key == recipe.variants()[0].key
    windows = validate_recipe({**base, "evaluations": {"perplexity": {"protocol": "windows"}}})
    assert windows.evaluations.model_dump(mode="json", exclude_defaults=True) == {"perplexity": {}}
    chunked = validate_recipe({**base, "evaluations": {"perplexity": {"protocol": "kv-chunked"}}})
    assert windows.variants()[0].key != chunked.variants()[0].key


def test_the_comparison_key_names_what_two_runs_must_share() -> None:
    from quantlab.eval.perplexity import protocol_of

    stamp = {"name": "windows", "window_tokens": 512, "stride_tokens": 512, "text_sha256": "cd" * 32}
    assert protocol_of(stamp).comparison_key(stamp) == "windows, window 512, stride 512, text sha256 cdcdcdcdcdcd"
    assert protocol_of({"name": "gone"}).__name__ == "PerplexityProtocol"  # an old folder's protocol still reads
