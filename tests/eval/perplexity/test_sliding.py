"""Protocol sliding: each token scored once with up to window - stride tokens of context."""
import math

import pytest
import torch
import torch.nn.functional as F

from quantlab.data import Text
from quantlab.eval.perplexity.base import perplexity
from tests.conftest import make_llama

CPU = torch.device("cpu")
TEXT = Text("test", "x")


def _ids(n: int = 1000) -> torch.Tensor:
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(0))


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


def test_sliding_owns_its_stride_and_refuses_one_beyond_the_window() -> None:
    from quantlab.extend import PERPLEXITY_PROTOCOLS

    assert PERPLEXITY_PROTOCOLS["sliding"].build(window_tokens=128, stride_tokens=64).stride_tokens == 64
    for stride in (None, 129):
        with pytest.raises(ValueError, match="stride_tokens between 1 and window_tokens"):
            PERPLEXITY_PROTOCOLS["sliding"].build(window_tokens=128, stride_tokens=stride)
