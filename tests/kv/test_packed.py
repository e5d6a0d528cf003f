"""The packed cache layers: codecs' bytes equal their formulas, stored positions come back within the codes'
error, the residual window stays in full precision, and chunks merge and drop without changing what is returned."""
import pytest
import torch

from quantlab.kv.packed import CastChunk, Codec, IntChunk, PackedKVLayer, PackedSlidingKVLayer

B, H, D = 2, 3, 64


def _states(tokens: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, H, tokens, D, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("codec", [Codec(bits=8), Codec(bits=4, group_size=32), Codec(bits=2, group_size=16),
                                   Codec(bits=4, axis="channel", group_size=16), Codec(dtype=torch.bfloat16),
                                   Codec(dtype=torch.float8_e4m3fn)], ids=str)
def test_a_codec_holds_the_bytes_its_formula_says_and_bounds_its_error(codec: Codec) -> None:
    x = _states(32)
    blocks = [codec.encode(x[:, :, s: s + codec.block]) for s in range(0, 32, codec.block)]  # as a layer stores them
    assert sum(c.nbytes for c in blocks) == codec.nbytes(B, H, 32, D) and sum(c.tokens for c in blocks) == 32
    chunk = codec.encode(x) if codec.block == 1 else blocks[0]
    x = x if codec.block == 1 else x[:, :, : codec.block]
    back = chunk.dequantize(torch.float32)
    assert back.shape == x.shape
    bound = {8: 0.01, 4: 0.15, 2: 0.6, None: 0.07}[codec.bits]
    assert ((back - x).norm() / x.norm()).item() < bound
    assert chunk.nbytes < x.numel() * 4  # fewer bytes than float32, whatever the codec


def test_token_axis_chunks_merge_and_drop_without_changing_their_values() -> None:
    codec = Codec(bits=4, group_size=32)
    a, b = codec.encode(_states(8, 1)), codec.encode(_states(5, 2))
    joined = a.merged(b)
    assert isinstance(joined, IntChunk) and joined.tokens == 13 and joined.nbytes == a.nbytes + b.nbytes
    assert torch.equal(joined.dequantize(torch.float32), torch.cat([a.dequantize(torch.float32),
                                                                    b.dequantize(torch.float32)], dim=2))
    kept = joined.drop_first(6)
    assert kept is not None and torch.equal(kept.dequantize(torch.float32), joined.dequantize(torch.float32)[:, :, 6:])
    per_channel = Codec(bits=4, axis="channel", group_size=8).encode(_states(8))
    assert per_channel.merged(per_channel) is None and per_channel.drop_first(1) is None  # a block stays whole


def test_fp8_chunks_keep_a_scale_per_position_and_head() -> None:
    chunk = Codec(dtype=torch.float8_e4m3fn).encode(_states(4) * 1000)
    assert isinstance(chunk, CastChunk) and chunk.scale is not None and chunk.scale.shape == (B, H, 4, 1)
    assert chunk.nbytes == B * H * 4 * (D + 2)


def test_a_layer_stores_positions_past_its_residual_and_returns_every_position() -> None:
    layer = PackedKVLayer(Codec(bits=8), Codec(bits=8), residual_tokens=4)
    seen_k, seen_v = [], []
    for step, tokens in enumerate((10, 1, 1, 1)):
        k, v = _states(tokens, 10 + step), _states(tokens, 20 + step)
        seen_k.append(k)
        seen_v.append(v)
        keys, values = layer.update(k, v)
        everything_k, everything_v = torch.cat(seen_k, dim=2), torch.cat(seen_v, dim=2)
        assert keys.shape == everything_k.shape and layer.get_seq_length() == everything_k.shape[2]
        assert torch.equal(keys[:, :, -4:], everything_k[:, :, -4:])  # the residual window, exact
        assert torch.allclose(keys, everything_k, atol=0.05) and torch.allclose(values, everything_v, atol=0.05)
    assert layer.stored_tokens == 13 - 4 and layer.keys.shape[2] == 4
    packed = Codec(bits=8).nbytes(B, H, 9, D) * 2
    assert layer.nbytes == packed + 2 * B * H * 4 * D * 4
    assert layer.residual_after(13) == 4


def test_a_channel_axis_layer_moves_whole_blocks_of_positions() -> None:
    layer = PackedKVLayer(Codec(bits=4, axis="channel", group_size=8), Codec(bits=4, group_size=32), residual_tokens=2)
    layer.update(_states(13), _states(13, 1))
    assert layer.stored_tokens == 8 and layer.keys.shape[2] == 5 and layer.residual_after(13) == 5


def test_a_sliding_layer_returns_its_window_and_forgets_what_falls_out() -> None:
    layer = PackedSlidingKVLayer(sliding_window=8, key_codec=Codec(bits=8), value_codec=Codec(bits=8), residual_tokens=2)
    keys, _ = layer.update(_states(12), _states(12, 1))
    assert keys.shape[2] == 12  # the prompt attends to itself whole
    for step in range(3):
        keys, _ = layer.update(_states(1, 30 + step), _states(1, 40 + step))
        assert keys.shape[2] == 8  # window - 1 earlier positions and the new one
    assert layer.inner.get_seq_length() - sum(c.tokens for c in layer.inner.key_chunks) - layer.inner.keys.shape[2] \
        == layer.inner.stored_tokens - sum(c.tokens for c in layer.inner.key_chunks)
    assert sum(c.tokens for c in layer.inner.key_chunks) + layer.inner.keys.shape[2] <= 8
