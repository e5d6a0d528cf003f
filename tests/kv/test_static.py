"""The static quantized KV caches (run uncompiled here; compiled in tests/engine/test_compiled.py): the same
logits as the dynamic layers at every step, global and sliding-window layers (the window of 8 is passed and
per-channel blocks straddle its edge), bytes equal to the static formula, a second prompt refused."""
import pytest
import torch

from quantlab.engine.torch.decode import Generation
from quantlab.errors import UnsupportedError
from quantlab.extend import KV_FORMATS
from quantlab.kv.packed import Codec
from quantlab.kv.static import CodeStore

CPU = torch.device("cpu")
CASES = [("int", dict(bits=4, group_size=16, residual_tokens=4)), ("int", dict(bits=8, group_size=32, residual_tokens=0)),
         ("int", dict(bits=2, key_axis="channel", group_size=4, residual_tokens=3)),
         ("int", dict(bits=3, key_axis="channel", group_size=8, residual_tokens=0)), ("fp8", {}), ("bf16", {}),
         ("int", dict(bits=4, group_size=16, residual_tokens=40)),
         ("int", dict(bits=4, group_size=16, residual_tokens=10)),  # a residual wider than the window of 8
         ("native", {}), ("nvfp4", dict(residual_tokens=4)), ("mxfp4", {}), ("mxfp8", dict(residual_tokens=10))]
PROMPT, STEPS = 13, 12


def tiny(arch: str, head_dim: int = 32) -> torch.nn.Module:
    """Two heads of queries per KV head; ``head_dim`` 64 lets the Hadamard rotation apply."""
    import transformers as tf

    torch.manual_seed(0)
    heads = 128 // head_dim
    common = dict(vocab_size=128, hidden_size=64 if head_dim == 32 else 128, intermediate_size=128,
                  num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=head_dim,
                  max_position_embeddings=256)
    if arch == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common, num_hidden_layers=2)).eval()
    config = tf.Gemma3TextConfig(**common, num_hidden_layers=3, sliding_window=8,
                                 layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    return tf.Gemma3ForCausalLM(config).eval()


def stepwise_logits(model: torch.nn.Module, kv, max_cache_len: int | None) -> tuple[list[torch.Tensor], int]:
    gen = Generation(model, kv, CPU, None, max_cache_len)
    gen.prefill(torch.arange(1, PROMPT + 1).unsqueeze(0) * 5 % 128)
    out = [gen.logits.clone()]
    for _ in range(STEPS):
        gen.decode(1)
        out.append(gen.logits.clone())
    return out, kv.cache_bytes(gen.cache)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("name,fields", CASES)
def test_static_layers_give_the_dynamic_layers_logits_at_every_step(arch: str, name: str, fields: dict) -> None:
    model, kv = tiny(arch), KV_FORMATS[name].build(**fields)
    dynamic, _ = stepwise_logits(model, kv, None)
    static, nbytes = stepwise_logits(model, kv, PROMPT + STEPS)
    for step, (d, s) in enumerate(zip(dynamic, static)):
        assert torch.allclose(s, d, atol=1e-5, rtol=1e-5), (step, (s - d).abs().max())
    assert nbytes == kv.cache_bytes_analytic(model.config, 1, PROMPT + STEPS, torch.float32, static=True)


def test_a_sliding_layer_keeps_the_blocks_its_window_can_see() -> None:
    # Window 8, residual 3, blocks of 4: at most 5 stored positions visible, over at most 3 blocks.
    from quantlab.kv.static import sliding_capacity

    assert sliding_capacity(8, 3, 4) == (6, 12) and sliding_capacity(8, 3, 1) == (3, 5)
    assert sliding_capacity(8, 8, 4) == (8, 0)  # the residual covers the window: nothing stored


def test_static_formula_counts_the_preallocated_layout() -> None:
    # Global layer of 25 positions, residual 3, blocks of 4 (KIVI keys): 20 stored, a ring of 3 + 4 - 1 = 6.
    model, kv = tiny("llama"), KV_FORMATS["int"].build(bits=2, key_axis="channel", group_size=4, residual_tokens=3)
    key, value, _ = kv.codecs()
    per_layer = key.nbytes(1, 2, 20, 32) + value.nbytes(1, 2, 20, 32) + 2 * 2 * 6 * 32 * 4
    assert kv.cache_bytes_analytic(model.config, 1, 25, torch.float32, static=True) == 2 * per_layer
    # 2-bit codes with a scale and zero per 4 positions: 1 byte per value, a quarter of float32
    assert 4 * key.nbytes(1, 2, 20, 32) == 2 * 20 * 32 * 4


@pytest.mark.parametrize("codec", [Codec(bits=4, group_size=16), Codec(bits=3, axis="channel", group_size=8),
                                   Codec(dtype=torch.float8_e4m3fn), Codec(dtype=torch.bfloat16)])
def test_a_code_store_gives_back_what_the_dynamic_codec_stores(codec: Codec) -> None:
    x = torch.randn(2, 3, 16, 32)
    x[0, 0, 0] = 0  # a zero row (a padding token's keys) stays finite in every codec
    store = CodeStore(codec, 2, 3, 16, 32, CPU)
    store.write(torch.arange(16), x)
    # the dynamic layers encode a block of positions at a time (one for token-axis and cast codecs)
    block = codec.block if codec.block > 1 else 16
    want = torch.cat([codec.encode(x[:, :, i:i + block]).dequantize(torch.float32) for i in range(0, 16, block)], 2)
    assert torch.equal(store.read(torch.float32), want)
    assert torch.isfinite(store.read(torch.float32)).all()
    assert store.nbytes == codec.nbytes(2, 3, 16, 32)


def test_a_second_prompt_into_a_static_cache_is_refused() -> None:
    model, kv = tiny("llama"), KV_FORMATS["int4"].build(group_size=16, residual_tokens=2)
    gen = Generation(model, kv, CPU, None, 40)
    gen.prefill(torch.arange(8).unsqueeze(0))
    with pytest.raises(UnsupportedError, match="one prefill"):
        gen.prefill(torch.arange(8).unsqueeze(0))


@pytest.mark.parametrize("fields", [dict(bits=4, group_size=16, residual_tokens=4),
                                    dict(bits=2, key_axis="channel", group_size=4, residual_tokens=3)])
def test_a_batch_of_sequences_keeps_each_row_its_own(fields: dict) -> None:
    model, kv = tiny("llama"), KV_FORMATS["int"].build(**fields)
    ids = torch.stack([torch.arange(1, PROMPT + 1) * 5 % 128, torch.arange(PROMPT) * 3 % 128])
    out = {}
    for length in (None, PROMPT + 6):
        gen = Generation(model, kv, CPU, None, length)
        gen.prefill(ids)
        gen.decode(6)
        out[length] = gen.logits
    assert torch.allclose(out[PROMPT + 6], out[None], atol=1e-5)
    assert not torch.allclose(out[None][0], out[None][1], atol=1e-3)
