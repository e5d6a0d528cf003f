"""The token embedding in ggml blocks (``BlockEmbedding``): llama.cpp's named mixes store an untied table in their
default type and a tied one as the head's tensor; a lookup returns the blocks' numbers for the ids asked."""
import pytest
import torch

from quantlab import QuantizedLinear, quantize_
from quantlab.engine.memory import decode_weight_bytes_read, weight_bytes_analytic, weight_bytes_by_component
from quantlab.quant.embedding import BlockEmbedding
from quantlab.quant.format import build_format
from quantlab.quant.forms.ggml.kernel import quantize_ggml
from tests.conftest import make_llama

IDS = torch.tensor([[0, 5, 4095, 5, 17]])


def test_an_untied_table_takes_the_mix_s_default_type_and_a_lookup_reads_its_blocks() -> None:
    model = make_llama(tie_word_embeddings=False, hidden_size=256)
    table = model.get_input_embeddings().weight.detach().clone()
    report = quantize_(model, build_format({"format": "gguf", "recipe": "Q4_K_M"}))
    lookup = model.get_input_embeddings()
    assert isinstance(lookup, BlockEmbedding) and not lookup.tied and lookup.ggml_type == "Q4_K"
    assert report.details["model.embed_tokens"] == {"ggml_type": "Q4_K"}
    rounded = quantize_ggml(table, "Q4_K")
    assert torch.equal(lookup.blocks, rounded.blocks)
    assert torch.equal(lookup(IDS), rounded.dequantize()[IDS])
    table_bytes = rounded.layout_nbytes()
    assert weight_bytes_by_component(model)["embedding"] == table_bytes == lookup.analytic_weight_bytes()
    assert table_bytes == 4096 * 256 // 256 * 144  # Q4_K: 144 bytes per 256 weights
    head = model.get_output_embeddings()
    assert isinstance(head, QuantizedLinear) and head.kernel.stored().ggml_type == "Q6_K"
    read = decode_weight_bytes_read(model)
    assert read == weight_bytes_analytic(model) - table_bytes  # a lookup reads one row, not the table


def test_a_tied_table_is_the_head_s_blocks_stored_once() -> None:
    model = make_llama(hidden_size=256)
    table = model.get_input_embeddings().weight.detach().clone()
    quantize_(model, build_format({"format": "gguf", "recipe": "Q4_K_M"}))
    lookup, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(lookup, BlockEmbedding) and lookup.tied
    assert lookup.stored().blocks.data_ptr() == head.kernel.blocks.data_ptr()
    rounded = quantize_ggml(table, "Q6_K")
    assert torch.equal(lookup(IDS), rounded.dequantize()[IDS])
    assert weight_bytes_by_component(model)["embedding"] == 0  # counted once, with the head that reads it whole


def test_a_plain_type_keeps_the_table_and_a_head_in_another_kernel_keeps_its_copy() -> None:
    model = make_llama(tie_word_embeddings=False)
    quantize_(model, build_format({"format": "gguf", "type": "Q4_0"}))
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)  # only the named mixes type the table
    tied = make_llama()
    quantize_(tied, build_format({"format": "int4", "overrides": [{"modules": "lm_head", "format": "int8"}]}))
    assert isinstance(tied.get_input_embeddings(), torch.nn.Embedding)


def test_gemma_s_scaled_lookup_keeps_its_scale_and_compiles() -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=4096, hidden_size=256, intermediate_size=512,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=128, sliding_window=64)).eval()
    with torch.no_grad():
        before = model.get_input_embeddings()(IDS)
    quantize_(model, build_format({"format": "gguf", "recipe": "Q8_0"}))
    lookup = model.get_input_embeddings()
    assert isinstance(lookup, BlockEmbedding) and lookup.embed_scale is not None
    with torch.no_grad():
        after = lookup(IDS)
        compiled = torch.compile(lookup, fullgraph=True)(IDS)
    assert torch.equal(compiled, after)
    assert (after - before).abs().max() <= 0.01 * before.abs().max()  # Q8_0 rounding, scale applied once


def test_a_block_embedding_owns_its_table_or_reads_a_head_s() -> None:
    with pytest.raises(ValueError, match="not both"):
        BlockEmbedding(None, torch.float32)
