"""Decode attention over stored KV codes: the C scores and weighted sums equal the products with the dequantized
store (every integer width, groups, keys per channel, float casts, the block forms NVFP4, MXFP4, MXFP8, q8_0 and
q4_0, head sizes off the SIMD width, 1-5 query rows per head, a batch) and stop at the stored length, and a static
layer attending this way (rotated stores included) gives the dynamic layers' logits at every step."""
import pytest
import torch

from quantlab.engine.torch.attention import FUSED_NAME
from quantlab.engine.torch.compiled import attention_implementation
from quantlab.extend import KV_FORMATS
from quantlab.kv import code_attention
from quantlab.kv.packed import Codec
from quantlab.kv.static import CodeStore

CPU = torch.device("cpu")
CODECS = [Codec(bits=b, group_size=g) for b in range(2, 9) for g in (16, 64)] + [
    Codec(dtype=d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)] + [
    Codec(bits=b, axis="channel", group_size=g) for b in (2, 3, 4) for g in (4, 16)]  # keys per channel (KIVI)
BLOCK_CODECS = [Codec(element=e) for e in code_attention.BLOCK_KINDS]


def filled_store(codec: Codec, b: int, h: int, slots: int, d: int) -> CodeStore:
    torch.manual_seed(0)
    store = CodeStore(codec, b, h, slots, d, CPU)
    store.write(torch.arange(slots), torch.randn(b, h, slots, d) * 3)
    return store


@pytest.mark.parametrize("codec", CODECS, ids=str)
@pytest.mark.parametrize("d,g", [(64, 3), (32, 1), (40, 5), (20, 4), (96, 6)])
def test_scores_and_values_equal_the_products_with_the_dequantized_store(codec: Codec, d: int, g: int) -> None:
    b, h, slots = 2, 2, 48
    store = filled_store(codec, b, h, slots, d)
    assert code_attention.reads_codes(store)
    ref = store.read(torch.float32).reshape(b * h, slots, d)
    q, p = torch.randn(b * h, g, d), torch.softmax(torch.randn(b * h, g, slots), -1)
    args = code_attention._store_args(store)
    for valid in (slots, 32, 0):  # whole blocks of a per-channel store
        n = torch.tensor(valid)
        scores = code_attention.scores_op(*args, n, q)
        values = code_attention.values_op(*args, n, p) if codec.axis == "token" else None
        want = q @ ref[:, :valid].transpose(1, 2)
        assert torch.allclose(scores[..., :valid], want, atol=1e-4, rtol=1e-5)
        assert torch.equal(scores[..., valid:], torch.zeros_like(scores[..., valid:]))  # nothing past the length
        if codec.axis == "token":  # values are always stored per position
            assert torch.allclose(values, p[..., :valid] @ ref[:, :valid], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("codec", [Codec(bits=8, group_size=64), Codec(bits=4, group_size=16), Codec(bits=2, axis="channel",
                                   group_size=16), Codec(dtype=torch.float8_e4m3fn), Codec(element="q8_0")], ids=str)
@pytest.mark.parametrize("ring_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d,g", [(64, 3), (40, 5)])
def test_a_ring_in_the_same_call_gives_the_stored_and_the_ring_products_bit_for_bit(codec: Codec, ring_dtype: torch.dtype,
                                                                                  d: int, g: int) -> None:
    # One call per op for a layer's stored slots and its float ring: the scores are the stored call's with the
    # ring's dense scores after them, the values the stored call's plus the ring's, the very floats of two calls.
    if codec.element is not None and d % 32:
        pytest.skip("the block forms take whole blocks of 32 channels")
    b, h, slots, ring = 2, 2, 48, 7
    store = filled_store(codec, b, h, slots, d)
    keys, values = (torch.randn(b, h, ring, d).to(ring_dtype) for _ in range(2))
    q, p = torch.randn(b * h, g, d), torch.rand(b * h, g, slots + ring)
    args = code_attention._store_args(store)
    kind = code_attention.CASTS[ring_dtype]
    for valid in (slots, 32, 0):
        n, every = torch.tensor(valid), torch.tensor(ring)
        scores = code_attention.ring_scores_op(*args, n, q, keys)
        want = torch.cat([code_attention.scores_op(*args, n, q),
                          code_attention.scores_op(kind, 0, d, d, keys, None, None, every, q)], -1)
        assert torch.equal(scores, want)
        if codec.axis == "token":
            got = code_attention.ring_values_op(*args, n, p, values)
            stored = code_attention.values_op(*args, n, p[..., :slots].contiguous())
            recent = code_attention.values_op(kind, 0, d, d, values, None, None, every, p[..., slots:].contiguous())
            assert torch.equal(got, stored + recent)
            assert torch.equal(code_attention.kv_values(*args, n, p, values), got)  # the ctypes call agrees
        assert torch.equal(code_attention.kv_scores(*args, n, q, keys), scores)


@pytest.mark.parametrize("codec", BLOCK_CODECS, ids=str)
@pytest.mark.parametrize("d,g", [(64, 3), (32, 1), (96, 4)])
@pytest.mark.parametrize("simd", [True, False])
def test_block_forms_equal_the_products_with_the_dequantized_store(codec: Codec, d: int, g: int, simd: bool) -> None:
    b, h, slots = 2, 2, 40
    store = filled_store(codec, b, h, slots, d)
    assert code_attention.reads_codes(store)
    ref = store.read(torch.float32).reshape(b * h, slots, d)
    assert ref.abs().max() > 1  # the store holds the values, not zeros
    q, p = torch.randn(b * h, g, d), torch.softmax(torch.randn(b * h, g, slots), -1)
    args = list(code_attention._store_args(store))
    if not simd:  # a block of 4 is not a multiple of 8: the scalar decoder reads the same bytes
        args = _as_scalar_path(args)
    for valid in (slots, 17, 0):
        n = torch.tensor(valid)
        scores = code_attention.scores_op(*args, n, q)
        values = code_attention.values_op(*args, n, p)
        assert torch.allclose(scores[..., :valid], q @ ref[:, :valid].transpose(1, 2), atol=1e-4, rtol=1e-5)
        assert torch.equal(scores[..., valid:], torch.zeros_like(scores[..., valid:]))
        assert torch.allclose(values, p[..., :valid] @ ref[:, :valid], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d,g", [(64, 3), (20, 2)])
def test_fp8_with_static_head_scales_is_read_as_codes_and_scaled_per_head(d: int, g: int) -> None:
    b, h, slots = 2, 3, 24
    store = filled_store(Codec(dtype=torch.float8_e4m3fn, head_scale=(0.01, 0.05, 0.2)), b, h, slots, d)
    assert code_attention.reads_codes(store) and code_attention._store_args(store)[5] is None  # no scale stored
    ref = store.read(torch.float32).reshape(b * h, slots, d)
    q, p = torch.randn(b * h, g, d), torch.softmax(torch.randn(b * h, g, slots), -1)
    args, scale = code_attention._store_args(store), code_attention._head_scale(store, b)
    assert scale.flatten().tolist() == pytest.approx([0.01, 0.05, 0.2] * b)  # batch-major, as the rows are
    for valid in (slots, 9):
        n = torch.tensor(valid)
        scores = code_attention.scores_op(*args, n, q) * scale
        values = code_attention.values_op(*args, n, p) * scale
        assert torch.allclose(scores[..., :valid], q @ ref[:, :valid].transpose(1, 2), atol=1e-4, rtol=1e-5)
        assert torch.allclose(values, p[..., :valid] @ ref[:, :valid], atol=1e-5, rtol=1e-5)


def _as_scalar_path(args: list) -> list:
    """The store's arguments with every block scale repeated for blocks of 4 (the C decoder's scalar path; q4_0's
    nibble order stays that of its blocks of 32)."""
    kind, bits, block, d, codes, scales, zeros = args
    per = block // 4
    width = 2 if kind in (code_attention.BLOCK_KINDS["q8_0"], code_attention.BLOCK_KINDS["q4_0"]) else 1
    s = scales.reshape(*scales.shape[:-1], -1, width).repeat_interleave(per, -2).reshape(*scales.shape[:-1], -1)
    return [kind, bits, 4, d, codes, s.contiguous(), zeros]


def tiny_model(arch: str, head_dim: int = 32) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=96, intermediate_size=128, num_attention_heads=6, num_key_value_heads=2,
                  head_dim=head_dim, max_position_embeddings=256)
    if arch == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common, num_hidden_layers=2)).eval()
    config = tf.Gemma3TextConfig(**common, num_hidden_layers=2, sliding_window=8, final_logit_softcapping=None,
                                 layer_types=["sliding_attention", "full_attention"])
    return tf.Gemma3ForCausalLM(config).eval()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("name,fields", [("int", dict(bits=4, group_size=16, residual_tokens=4)),
                                         ("int", dict(bits=8, group_size=32, residual_tokens=0)),
                                         ("int", dict(bits=3, group_size=8, residual_tokens=30)), ("fp8", {}),
                                         ("int", dict(bits=2, key_axis="channel", group_size=4, residual_tokens=3)),
                                         ("int", dict(bits=4, key_axis="channel", group_size=4, residual_tokens=2,
                                                      rotate="hadamard")),
                                         ("int", dict(bits=4, group_size=32, residual_tokens=2, rotate="hadamard")),
                                         ("nvfp4", dict(residual_tokens=3)), ("mxfp4", {}),
                                         ("mxfp8", dict(rotate="hadamard", residual_tokens=1)),
                                         ("q8_0", dict(rotate="hadamard")), ("q4_0", {}),
                                         ("q4_0", dict(rotate="hadamard")), ("fp8", dict(scales="head"))])
def test_a_static_layer_attending_over_its_codes_gives_the_dynamic_layers_logits(arch: str, name: str, fields: dict,
                                                                                 monkeypatch) -> None:
    from quantlab.engine.torch.decode import Generation

    calls = []
    attend = code_attention.attend
    monkeypatch.setattr(code_attention, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    model, kv = tiny_model(arch, 64 if "rotate" in fields else 32), KV_FORMATS[name].build(**fields)  # rotated: 64s
    ids = torch.stack([torch.arange(1, 14) * 5 % 128, torch.arange(13) * 3 % 128])
    kv = kv.calibrated(model, [ids[:1], ids[1:]])  # static per-head fp8 scales from these rows (others: unchanged)
    logits = {}
    for length in (None, 13 + 12):
        gen = Generation(model, kv, CPU, None, length)
        with attention_implementation(model, FUSED_NAME):
            gen.prefill(ids)
            steps = [gen.logits.clone()]
            for _ in range(12):
                gen.decode(1)
                steps.append(gen.logits.clone())
        logits[length] = steps
    global_layers = 1 if arch == "gemma3" else 2
    assert len(calls) == 12 * global_layers  # every decode step of every global layer, none for the dynamic cache
    for step, (d, s) in enumerate(zip(logits[None], logits[25])):
        assert torch.allclose(s, d, atol=1e-5, rtol=1e-5), (step, (s - d).abs().max())


def test_without_a_c_compiler_a_static_layer_keeps_the_expression_path(monkeypatch) -> None:
    monkeypatch.setattr(code_attention, "available", lambda: False)
    store = filled_store(Codec(bits=4, group_size=16), 1, 1, 8, 32)
    assert not code_attention.reads_codes(store)
    from quantlab.engine.torch.decode import Generation

    model, kv = tiny_model("llama"), KV_FORMATS["int"].build(bits=4, group_size=16, residual_tokens=4)
    ids = torch.arange(1, 14).unsqueeze(0) * 5 % 128
    out = []
    for length in (None, 13 + 4):
        gen = Generation(model, kv, CPU, None, length)
        with attention_implementation(model, FUSED_NAME):
            gen.prefill(ids)
            gen.decode(4)
        assert not any(getattr(layer, "reads_codes", False) for layer in gen.cache.layers)
        out.append(gen.logits)
    assert torch.allclose(out[0], out[1], atol=1e-5)
