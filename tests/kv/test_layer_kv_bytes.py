"""Per-layer KV-cache bytes at a workload: they sum to the format's whole-model figure (the estimate's), sliding
layers keep at most their window."""
import pytest
import torch

from quantlab.estimate.worksheet import kv_payload, normalized_config
from quantlab.extend import KV_FORMATS
from quantlab.kv.format import layer_kv_bytes

FORMATS = ["native", "int8", "int4", "q8_0", "fp8", "nvfp4"]


def _gemma_like():
    from transformers import Gemma3TextConfig

    # five sliding layers (window 512) to one global, as Gemma 3; 4 KV heads of 64 to keep it small
    return Gemma3TextConfig(num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                            hidden_size=256, intermediate_size=512, sliding_window=512, vocab_size=1024)


def _llama_like():
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=512,
                       intermediate_size=1024, vocab_size=1024)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("make", [_llama_like, _gemma_like], ids=["llama", "gemma3"])
def test_layers_sum_to_the_whole_cache(name: str, make) -> None:
    config, fmt = make(), KV_FORMATS[name].build()
    for batch, tokens in ((1, 300), (8, 8192)):
        layers = layer_kv_bytes(fmt, config, batch, tokens, torch.bfloat16)
        assert len(layers) == config.num_hidden_layers
        assert sum(layers) == fmt.cache_bytes_analytic(config, batch, tokens, torch.bfloat16)


def test_sliding_layers_stop_at_their_window_and_match_the_estimate() -> None:
    from quantlab.estimate.evidence import read_architecture
    from quantlab.estimate.worksheet import config_object

    config = _gemma_like()
    native = KV_FORMATS["native"].build()
    layers = layer_kv_bytes(native, config, 8, 32_768, torch.bfloat16)
    per_position = 2 * 4 * 64 * 2 * 8  # K and V x heads x head dim x bf16 bytes x batch
    kinds = config.layer_types
    assert [b for b, k in zip(layers, kinds) if k == "full_attention"] == [per_position * 32_768] * kinds.count("full_attention")
    assert [b for b, k in zip(layers, kinds) if k == "sliding_attention"] == [per_position * 512] * kinds.count("sliding_attention")
    raw = config.to_dict()
    arch = read_architecture(raw, config_object(raw))
    assert kv_payload(arch, native, 8, 32_768, torch.bfloat16).bytes_retained == sum(layers)
    assert normalized_config(arch).num_hidden_layers == 12
