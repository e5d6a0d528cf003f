"""llama.cpp's named mixes: quantlab gives every linear and the output head the type llama.cpp's quantizer
writes for it (kept from llama.cpp 0.3.36 for two models: ``gguf_recipe_reference/types.json``), and with
llama-cpp-python the exported blocks are the very bytes of llama.cpp's own file."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from quantlab import export_, quantize_
from quantlab.paths import BUNDLED_DIR
from quantlab.quant.embedding import BlockEmbedding
from quantlab.quant.format import build_format
from quantlab.quant.formats.gguf_recipes import RECIPES, use_more_bits
from quantlab.quant.io.gguf import linear_tensor_names
from quantlab.quant.linear import QuantizedLinear
from tests.quant.formats.gguf_recipe_reference.make import llama_cpp_types, thirty_two_layers

gguf = pytest.importorskip("gguf")

REFERENCE = json.loads((Path(__file__).parent / "gguf_recipe_reference" / "types.json").read_text())["types"]
TINY = BUNDLED_DIR / "tiny-stdlib-llama"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("l32")
    return {"tiny-stdlib-llama": (AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval(), TINY),
            "llama-32-layers": (thirty_two_layers(folder), folder)}


def _gguf_types(model: torch.nn.Module) -> dict[str, str]:
    """quantlab's stored type of each quantized linear and of a token embedding in blocks, by its GGUF tensor name
    (a tied head as llama.cpp's token_embd, which serves as its output matrix)."""
    tied = {"output.weight": "token_embd.weight"} if model.config.tie_word_embeddings else {}
    types = {tied.get(key, key): model.get_submodule(name).kernel.stored().ggml_type
             for name, key in linear_tensor_names(model).items()
             if isinstance(model.get_submodule(name), QuantizedLinear)}
    table = model.get_input_embeddings()
    if isinstance(table, BlockEmbedding):
        assert table.tied == bool(tied)  # a tied table reads the head's blocks, an untied one holds its own
        types["token_embd.weight"] = table.stored().ggml_type
    return types


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("which", ["tiny-stdlib-llama",  # the 32-layer model's rules (first and last eighths,
                                   pytest.param("llama-32-layers", marks=pytest.mark.slow)])  # every third): slow tier
def test_every_tensor_takes_llama_cpps_type(models, which: str, recipe: str) -> None:
    model = copy.deepcopy(models[which][0])
    quantize_(model, build_format({"format": "gguf", "recipe": recipe}))
    theirs = REFERENCE[which][recipe]
    ours = _gguf_types(model)
    assert set(ours) == {k for k, v in theirs.items() if v != "F32"}  # the norms stay F32; the embedding too is typed
    assert ours == {k: theirs[k] for k in ours}


def test_more_bits_go_to_the_first_and_last_eighth_and_every_third_layer() -> None:
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert build_format({"format": "gguf", "recipe": "Q4_K_M"}).label == "gguf-q4_k_m"
    with pytest.raises(ValueError, match="one of type"):
        build_format({"format": "gguf", "type": "Q4_K", "recipe": "Q4_K_M"})


@pytest.mark.llama_cpp
@pytest.mark.parametrize("recipe", ["Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_XS"])
def test_the_export_is_llama_cpps_own_file_tensor_for_tensor(models, recipe: str, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    model, source = models["llama-32-layers"]
    export_(model, "gguf", tmp_path / "f32", source=source)
    llama_cpp_types(tmp_path / "f32" / "model.gguf", recipe, tmp_path / "theirs.gguf")
    ours_model = copy.deepcopy(model)
    quantize_(ours_model, build_format({"format": "gguf", "recipe": recipe}))
    export_(ours_model, "gguf", tmp_path / "ours", source=source)
    theirs = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "theirs.gguf")).tensors}
    ours = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "ours" / "model.gguf")).tensors}
    for name, t in ours.items():  # the token embedding included: quantlab stores it in the mix's type too
        assert t.tensor_type == theirs[name].tensor_type, name
        assert np.array_equal(np.array(t.data), np.array(theirs[name].data)), name
    assert set(ours) == set(theirs)
    assert (tmp_path / "ours" / "model.gguf").stat().st_size == (tmp_path / "theirs.gguf").stat().st_size


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_a_mix_over_ggml_types_holds_a_named_mixs_bytes_and_exports(models, tmp_path: Path) -> None:
    """``mixed`` over GGUF types with ``budget_format: {format: gguf, recipe: Q4_K_M}``: the linears take at most
    the bytes llama.cpp's Q4_K_M gives them, and the chosen mix writes a GGUF whose tensors hold those types."""
    from quantlab.engine.memory import weight_bytes_analytic
    from quantlab.quant.format import Calibration

    model, source = models["tiny-stdlib-llama"]
    recipe_model = copy.deepcopy(model)
    quantize_(recipe_model, build_format({"format": "gguf", "recipe": "Q4_K_M"}))
    budget = sum(m.kernel.analytic_nbytes() for n, m in recipe_model.named_modules()
                 if isinstance(m, QuantizedLinear) and n != "lm_head")
    mixed = build_format({"format": "mixed", "candidates": [{"format": "gguf", "type": t} for t in
                                                            ("Q3_K", "Q4_K", "Q5_K", "Q6_K")],
                          "budget_format": {"format": "gguf", "recipe": "Q4_K_M"}, "scan_tokens": 128,
                          "export_to": "gguf"})
    ours = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    quantize_(ours, mixed, Calibration([torch.randint(0, 4096, (1, 64), generator=g) for _ in range(4)]))
    used = sum(m.kernel.analytic_nbytes() for m in ours.modules() if isinstance(m, QuantizedLinear))
    assert 0.97 * budget <= used <= budget
    assert weight_bytes_analytic(ours) < weight_bytes_analytic(model)
    result = export_(ours, "gguf", tmp_path, source=source)
    written = {info["type"] for info in result.tensors.values()}
    assert written & {"Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "Q8_0"} and result.max_abs_deviation == 0


@pytest.mark.parametrize("recipe", ["Q4_K_M", "Q3_K_M", "Q6_K"])
def test_the_estimate_from_the_config_is_the_bytes_the_model_holds(models, recipe: str) -> None:
    from quantlab.engine.memory import weight_bytes
    from quantlab.estimate.inventory import from_implementation
    from quantlab.estimate.worksheet import weight_payload

    model = copy.deepcopy(models["tiny-stdlib-llama"][0])
    fmt = build_format({"format": "gguf", "recipe": recipe})
    estimated = weight_payload(from_implementation(model.config), fmt, torch.float32).bytes
    quantize_(model, fmt)
    assert estimated == weight_bytes(model)
