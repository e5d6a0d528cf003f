import pytest
import torch
from torch import nn

from quantlab import QuantizedLinear, quantize_
from quantlab.engine.memory import weight_bytes_by_component
from quantlab.extend import WEIGHT_FORMATS
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
    report = quantize_(model, _fmt("int8", include=["*.mlp.*"], exclude=["*.down_proj"]))
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


def test_overrides_give_matching_modules_their_own_format_and_the_label_names_the_mix() -> None:
    model = make_llama()
    fmt = _fmt("int4", group_size=64, exclude=["*.o_proj"],
               overrides=[{"modules": "*.down_proj", "format": "int8"},
                          {"modules": ["*.q_proj", "*.k_proj"], "format": "rtn", "bits": 3, "group_size": 32}])
    assert fmt.label == "int4-g64-asym-no:o_proj+int8-pc-asym@down_proj+int3-g32-asym@q_proj,k_proj"
    report = quantize_(model, fmt)
    layer = model.model.layers[1]
    assert isinstance(layer.self_attn.o_proj, nn.Linear) and "model.layers.1.self_attn.o_proj" in report.kept
    assert layer.mlp.down_proj.form == "8-bit per channel"
    assert layer.self_attn.q_proj.form == "3-bit group 32"
    assert layer.mlp.up_proj.form == "4-bit group 64"
    assert report.details["model.layers.1.mlp.down_proj"]["format"] == "int8-pc-asym"
    assert report.details["model.layers.1.mlp.up_proj"]["format"] == "int4-g64-asym"
    assert len(report.replaced) == 2 * 6 and sorted(report.kept) == sorted(
        ["lm_head", "model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"])
    # Bytes follow each module's own layout.
    for name in report.replaced:
        module = model.get_submodule(name)
        assert module.analytic_weight_bytes() == fmt.format_for(name).linear_weight_bytes(
            module.out_features, module.in_features, torch.float32)


def test_include_keeps_everything_else_and_the_first_matching_override_wins() -> None:
    fmt = _fmt("int4", group_size=32, include=["*.mlp.*"],
               overrides=[{"modules": "*.layers.0.*", "format": "int8"}, {"modules": "*.down_proj", "format": "int2",
                                                                           "group_size": 32}])
    assert fmt.format_for("model.layers.0.self_attn.q_proj") is None
    assert fmt.format_for("model.layers.0.mlp.down_proj").label == "int8-pc-asym"
    assert fmt.format_for("model.layers.1.mlp.down_proj").label == "int2-g32-asym"
    assert fmt.format_for("model.layers.1.mlp.up_proj") is fmt
    report = quantize_(make_llama(), fmt)
    assert len(report.replaced) == 2 * 3


def test_a_calibrated_entry_sees_its_overrides_already_quantized() -> None:
    model = make_llama()
    fmt = _fmt("gptq", bits=4, group_size=32, overrides=[{"modules": "*.down_proj", "format": "int8"}])
    assert fmt.needs_calibration
    g = torch.Generator().manual_seed(0)
    report = quantize_(model, fmt, [torch.randint(0, 4096, (1, 32), generator=g) for _ in range(4)])
    assert model.model.layers[0].mlp.down_proj.form.startswith("8-bit") and model.model.layers[0].mlp.up_proj.form.startswith("4-bit")
    assert "output_error_gptq" in report.details["model.layers.0.mlp.up_proj"]
    assert "output_error_gptq" not in report.details["model.layers.0.mlp.down_proj"]
    # An RTN entry with a GPTQ override needs calibration too.
    assert _fmt("int4", group_size=32, overrides=[{"modules": "*.q_proj", "format": "gptq", "bits": 4}]).needs_calibration


def test_an_override_must_keep_the_compute_dtype_and_have_no_selection_of_its_own() -> None:
    with pytest.raises(ValueError, match="compute_dtype"):
        _fmt("int4", group_size=32, overrides=[{"modules": "*.down_proj", "format": "bf16"}])
    with pytest.raises(ValueError, match="no include"):
        _fmt("int4", group_size=32, overrides=[{"modules": "*.down_proj", "format": "int8", "exclude": ["x"]}])


@pytest.mark.parametrize("tied", [True, False])
def test_an_override_naming_the_head_quantizes_it_and_reads_fewer_bytes(tied: bool) -> None:
    from quantlab.engine.memory import decode_weight_bytes_read, weight_bytes

    plain, model = make_llama(tie_word_embeddings=tied), make_llama(tie_word_embeddings=tied)
    ids = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(0))
    table = model.model.embed_tokens.weight.detach().clone()
    fmt = _fmt("int4", group_size=32, overrides=[{"modules": "lm_head", "format": "int8"}])
    assert fmt.label == "int4-g32-asym+int8-pc-asym@lm_head"
    report = quantize_(model, fmt)
    quantize_(plain, _fmt("int4", group_size=32))
    assert "lm_head" in report.replaced and report.kept == [] and model.lm_head.form.startswith("8-bit")
    assert torch.equal(model.model.embed_tokens.weight, table)  # a tied table stays whole for the lookup
    with torch.no_grad():  # the int8 head's own error, beside the same int4 layers with the head unquantized
        assert _snr_db(plain(ids).logits, model(ids).logits) > 35
    head = 4096 * 128
    # One step reads the int8 head (a byte a weight, and a scale and zero point a row) instead of the fp32 one;
    # a tied model now also holds the table beside its quantized head.
    assert decode_weight_bytes_read(plain) - decode_weight_bytes_read(model) == 4 * head - model.lm_head.analytic_weight_bytes()
    assert weight_bytes(model) - weight_bytes(plain) == (
        model.lm_head.analytic_weight_bytes() - (0 if tied else 4 * head))
    # Calibrated formats cannot take the head; the format's own exclude still keeps it.
    with pytest.raises(ValueError, match="output head"):
        quantize_(make_llama(), _fmt("int4", group_size=32, overrides=[{"modules": "lm_head", "format": "gptq",
                                                                        "bits": 4}]), [ids])
    assert quantize_(make_llama(), fmt.model_copy(update={"exclude": ("lm_head",)})).kept == ["lm_head"]
