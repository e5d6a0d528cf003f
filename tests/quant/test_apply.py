import pytest
import torch
from torch import nn

from quantlab import WEIGHT_FORMATS, QuantizedLinear, quantize_
from quantlab.measure.memory import weight_bytes_by_component
from tests.conftest import make_llama


def _fmt(name: str, **params):
    return WEIGHT_FORMATS[name].build(**params)


def _snr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    return (10 * torch.log10(ref.pow(2).mean() / (ref - approx).pow(2).mean())).item()


def test_default_selection_quantizes_decoder_linears_and_keeps_the_head() -> None:
    model = make_llama()
    report = quantize_(model, _fmt("int4", group_size=128))
    assert len(report.replaced) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert report.kept == ["lm_head"]
    assert isinstance(model.model.layers[0].self_attn.k_proj, QuantizedLinear)
    assert isinstance(model.lm_head, nn.Linear) and isinstance(model.model.embed_tokens, nn.Embedding)


def test_include_and_exclude_patterns() -> None:
    model = make_llama()
    report = quantize_(model, _fmt("int8"), include=["*.mlp.*"], exclude=["*.down_proj", "lm_head"])
    assert sorted(report.replaced) == sorted(f"model.layers.{i}.mlp.{p}_proj" for i in range(2) for p in ("gate", "up"))


def test_int4_layers_hold_under_0_3x_their_fp16_bytes() -> None:
    model = make_llama(hidden_size=256, intermediate_size=512)
    numel = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head")
    quantize_(model, _fmt("int4", group_size=128))
    held = weight_bytes_by_component(model)["quantized_linear"]
    assert held / (2 * numel) <= 0.3


@pytest.mark.parametrize("name,params,min_snr_db", [("int8", {}, 35.0), ("int4", {"group_size": 128}, 12.0)])
def test_quantized_model_tracks_the_original(name: str, params: dict, min_snr_db: float) -> None:
    model = make_llama()
    ids = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        quantize_(model, _fmt(name, **params))
        out = model(ids).logits
    assert _snr_db(ref, out) > min_snr_db


def test_cast_formats_change_every_tensor_dtype() -> None:
    model = make_llama()
    quantize_(model, _fmt("bf16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_gpt2_conv1d_layers_are_quantized() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=512, n_positions=64)).eval()
    ids = torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        ref = model(ids).logits
        report = quantize_(model, _fmt("int8"))
        out = model(ids).logits
    assert len(report.replaced) == 2 * 4  # c_attn, c_proj, c_fc, mlp.c_proj
    assert _snr_db(ref, out) > 30


def test_a_kernel_that_cannot_take_the_tensor_is_a_clear_error() -> None:
    from quantlab import UnsupportedError

    with pytest.raises(UnsupportedError, match="kernel int4pack_mm_cpu does not support 4-bit group 16"):
        quantize_(make_llama(), _fmt("int4", group_size=16, compute_dtype="bfloat16", kernel="int4pack_mm_cpu"))
