import math

import pytest
import torch
import torch.nn.functional as F

from quantlab.data import Text
from quantlab.measure.perplexity import perplexity, window_spans
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


def test_sliding_with_stride_equal_to_window_is_the_windows_protocol() -> None:
    model, ids = make_llama(), _ids(1024)
    a = perplexity(model, ids, TEXT, protocol="windows", window_tokens=128, batch_size=4, device=CPU)
    b = perplexity(model, ids, TEXT, protocol="sliding", window_tokens=128, stride_tokens=128, batch_size=2, device=CPU)
    assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-5)  # batching changes the last bits only
    assert a["perplexity_protocol"]["scored_tokens"] == b["perplexity_protocol"]["scored_tokens"]


def test_sliding_matches_token_by_token_scoring_with_full_context() -> None:
    model, ids = make_llama(), _ids(200)
    got = perplexity(model, ids, TEXT, protocol="sliding", window_tokens=256, stride_tokens=64, batch_size=4, device=CPU)
    with torch.no_grad():  # the whole text fits one window: every token sees all before it
        logits = model(ids[None]).logits[0, :-1]
    assert got["perplexity"] == pytest.approx(math.exp(F.cross_entropy(logits, ids[1:]).item()), rel=1e-4)


def test_kv_chunked_protocol_reads_the_cache() -> None:
    """Full-precision caches agree with the windows protocol; a 2-bit cache is visibly worse than 8-bit."""
    from quantlab.data import load_text
    from quantlab.kv import KV_FORMATS
    from quantlab.measure.perplexity import cache_perplexity, tokenize
    from quantlab.models import load_model
    from quantlab.recipe import ModelSpec

    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"))
    text = load_text("bundled-heldout")
    ids = tokenize(loaded.tokenizer, text)[:4096]
    windows = perplexity(loaded.model, ids, text, protocol="windows", window_tokens=256, batch_size=8, device=CPU)

    def chunked(name: str, **params) -> float:
        kv = KV_FORMATS[name].build(**params)
        got = cache_perplexity(loaded.model, ids, text, kv, window_tokens=256, chunk_tokens=32, batch_size=8, device=CPU)
        assert got["perplexity_protocol"]["scored_tokens"] == windows["perplexity_protocol"]["scored_tokens"]
        return got["perplexity"]

    for name in ("native", "fp32", "bf16", "fp16"):
        assert chunked(name) == pytest.approx(windows["perplexity"], rel=0.005), name
    int8, int2 = chunked("int8", group_size=32, residual_tokens=0), chunked("int2", group_size=32, residual_tokens=0)
    assert int8 == pytest.approx(windows["perplexity"], rel=0.01)
    assert int2 > 1.02 * int8
