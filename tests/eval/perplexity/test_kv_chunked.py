"""Protocol kv-chunked: each window fed through the variant's KV cache a chunk at a time."""
import pytest
import torch

from quantlab.eval.perplexity.base import perplexity

CPU = torch.device("cpu")


def test_kv_chunked_protocol_reads_the_cache() -> None:
    """Full-precision caches agree with the windows protocol; a 2-bit cache is visibly worse than 8-bit."""
    from quantlab.data import load_text
    from quantlab.eval.perplexity.kv_chunked import cache_perplexity
    from quantlab.eval.tokens import tokenize
    from quantlab.kv import KV_FORMATS
    from quantlab.models import ModelSpec, load_model

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


def test_kv_chunked_reads_the_cache_and_says_so_in_its_summary() -> None:
    from quantlab.eval.perplexity import protocol_summary
    from quantlab.extend import PERPLEXITY_PROTOCOLS

    kv_chunked = PERPLEXITY_PROTOCOLS["kv-chunked"].build(chunk_tokens=16)
    assert kv_chunked.reads_kv_cache and not PERPLEXITY_PROTOCOLS["windows"].cls.reads_kv_cache
    stamp = {"name": "kv-chunked", "window_tokens": 256, "stride_tokens": 256, "chunk_tokens": 16, "kv_format": "int4",
             "scored_tokens": 2550, "text": "t", "text_sha256": "ab" * 32}
    assert protocol_summary(stamp) == ("kv-chunked: window 256, stride 256, chunks of 16 through the KV cache, 2,550 "
                                       "scored tokens of t (sha256 abababababab)")
