"""rotate-residual: the residual stream rotated by compressed-tensors' Hadamard matrix, folded into the embedding,
the norms and every linear; the logits unchanged by the transform alone, Gemma's norms refused, and the rotated
model exported whole."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from quantlab import export_, quantize_
from quantlab.errors import UnsupportedError
from quantlab.quant.format import build_format
from tests.conftest import make_llama

IDS = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(3))
ROTATE = {"format": "cast", "dtype": "float32", "transforms": ["rotate-residual"]}


@pytest.mark.parametrize("tied", [True, False])
def test_the_transform_alone_leaves_the_logits_unchanged(tied: bool) -> None:
    model = make_llama(tie_word_embeddings=tied)
    with torch.no_grad():
        want = model(IDS).logits
    rotated = copy.deepcopy(model)
    quantize_(rotated, build_format(ROTATE))
    assert rotated.lm_head.weight is not rotated.model.embed_tokens.weight  # the head took the final norm
    assert torch.equal(rotated.model.layers[0].input_layernorm.weight, torch.ones(128))
    with torch.no_grad():
        assert torch.allclose(rotated(IDS).logits, want, atol=2e-5, rtol=1e-4)


def test_the_rotation_is_compressed_tensors_hadamard_matrix_after_the_norm_is_folded() -> None:
    ct = pytest.importorskip("compressed_tensors.transform.utils.hadamard")
    model = make_llama()
    layer = model.model.layers[0]
    w, g = layer.self_attn.q_proj.weight.detach().clone(), layer.input_layernorm.weight.detach().clone()
    o = layer.self_attn.o_proj.weight.detach().clone()
    table = model.model.embed_tokens.weight.detach().clone()
    quantize_(model, build_format({**ROTATE, "transforms": [{"name": "rotate-residual", "seed": 5}]}))
    q = (ct.random_hadamard_matrix(128, torch.float64, gen=torch.Generator().manual_seed(5)) / math.sqrt(128)).float()
    assert torch.allclose(layer.self_attn.q_proj.weight, (w * g) @ q, atol=1e-5)
    assert torch.allclose(layer.self_attn.o_proj.weight, q.T @ o, atol=1e-5)
    assert torch.allclose(model.model.embed_tokens.weight, table @ q, atol=1e-5)


def test_rounding_after_the_rotation_and_what_is_refused() -> None:
    fmt = build_format({"format": "int4", "group_size": 32, "transforms": ["rotate-residual"]})
    assert fmt.label == "int4-g32-asym-rr0" and "compressed-tensors" in fmt.exports  # folded whole: it exports
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=64)).eval()
    with pytest.raises(UnsupportedError, match="rotate-residual folds"):
        quantize_(gemma, fmt)
    twice = build_format({"format": "int4", "group_size": 32, "transforms": ["rotate-residual"],
                          "overrides": [{"modules": "*.down_proj", "format": {"format": "int8",
                                                                             "transforms": ["rotate-residual"]}}]})
    with pytest.raises(UnsupportedError, match="already rotated"):
        quantize_(make_llama(), twice)


def test_the_rotated_int4_model_loads_in_transformers_with_the_measured_logits(tmp_path: Path) -> None:
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    model = make_llama()
    quantize_(model, build_format({"format": "int4", "group_size": 32, "symmetric": True,
                                   "transforms": ["rotate-residual"]}))
    export_(model, "compressed-tensors", tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert not loaded.config.tie_word_embeddings
    with torch.no_grad():
        measured, back = model(IDS).logits, loaded(IDS).logits
    assert torch.allclose(back, measured, atol=1e-4, rtol=1e-4)
