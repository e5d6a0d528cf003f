"""compressed-tensors export of the microscaling forms and block FP8: the folder holds the measured codes and
scales under compressed-tensors' names with its presets' weight arguments; its own decompressor gives back the
measured weights, and transformers loads the folder to the logits quantlab measured (top-1 agreement >= 99%, mean
KL <= 1e-3 over 4,096 positions of the bundled model). transformers 5.24's compressed path decompresses these forms
into bfloat16 on CPU (a float32 model then fails its first matmul), so the folders load with
``CompressedTensorsConfig(dequantize=True)``, as the export notes say."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("compressed_tensors")

from quantlab import export_, quantize_  # noqa: E402
from quantlab.paths import BUNDLED_DIR  # noqa: E402
from quantlab.quant.format import build_format  # noqa: E402
from tests.conftest import make_llama  # noqa: E402

IDS = torch.randint(0, 4096, (4, 1024), generator=torch.Generator().manual_seed(0))
SPECS = {"nvfp4": ({"format": "nvfp4"}, "NVFP4A16"), "mxfp4": ({"format": "mxfp4", "scale_rounding": "round"}, "MXFP4A16"),
         "mxfp8": ({"format": "mxfp8"}, "MXFP8A16"), "fp8-block": ({"format": "fp8", "block_size": 128}, "FP8_BLOCK")}


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


@pytest.fixture(scope="module", params=list(SPECS))
def exported(request, tmp_path_factory) -> tuple[str, torch.nn.Module, Path]:
    spec, _ = SPECS[request.param]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_DIR / "tiny-stdlib-llama", dtype=torch.float32).eval()
    quantize_(model, build_format(spec))
    folder = tmp_path_factory.mktemp(request.param)
    result = export_(model, "compressed-tensors", folder)
    assert any("dequantize=True" in note for note in result.notes) == (request.param != "fp8-block")
    return request.param, model, folder


def test_the_scheme_is_compressed_tensors_preset_and_its_decompressor_gives_the_measured_weight(exported) -> None:
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from safetensors.torch import load_file

    name, model, folder = exported
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    preset = PRESET_SCHEMES[SPECS[name][1]]["weights"].model_dump(mode="json")
    assert {k: group["weights"].get(k) for k in preset} == preset
    module = "model.layers.1.mlp.down_proj"
    tensors = {k[len(module) + 1:]: v for k, v in load_file(folder / "model.safetensors").items()
               if k.startswith(module + ".")}
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"])
    stored = model.get_submodule(module).kernel.stored()
    for key, value in stored.tensors().items():  # the measured codes and scales, byte for byte
        written = tensors["weight" if key == "codes" and name == "mxfp8" else {"codes": "weight_packed", "scales":
                          "weight_scale", "data": "weight", "global_scale": "weight_global_scale"}[key]]
        assert written.view(torch.uint8).flatten().tolist() == value.contiguous().view(torch.uint8).flatten().tolist()
    theirs = BaseCompressor.load_from_registry(group["format"]).decompress(tensors, scheme)["weight"].float()
    ours = stored.dequantize(torch.float32)
    # compressed-tensors decompresses the FP4 / MX forms in bfloat16: equal to within its rounding
    assert ((theirs - ours).abs() <= 2 ** -8 * ours.abs()).all()


def test_transformers_loads_the_folder_to_the_measured_logits(exported) -> None:
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    _, model, folder = exported
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                  quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    measured, back = _logits(model), _logits(loaded)
    assert (back.argmax(-1) == measured.argmax(-1)).float().mean() >= 0.99
    kl = torch.nn.functional.kl_div(back.log_softmax(-1), measured.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    assert kl.mean() <= 1e-3


@pytest.mark.parametrize("ties", ["even", "to_zero"])
def test_mxfp4_is_written_as_ggmls_mxfp4_blocks_that_decode_to_the_measured_weights(ties: str, tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_DIR / "tiny-stdlib-llama", dtype=torch.float32).eval()
    quantize_(model, build_format({"format": "mxfp4", "ties": ties}))
    result = export_(model, "gguf", tmp_path, source=BUNDLED_DIR / "tiny-stdlib-llama")
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    tensors = {t.name: t for t in reader.tensors}
    down = tensors["blk.1.ffn_down.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType.MXFP4
    theirs = gguf.quants.dequantize(down.data, down.tensor_type)
    ours = model.get_submodule("model.layers.1.mlp.down_proj").dequantize_weight().numpy()
    assert (theirs == ours).all()
    assert {info["max_abs_deviation"] for info in result.tensors.values() if info["type"] == "MXFP4"} == {0.0}


def test_single_level_nvfp4_is_written_as_ggmls_nvfp4_blocks_that_decode_to_the_measured_weights(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    model = make_llama()
    fmt = build_format({"format": "nvfp4", "arithmetic": "ggml"})
    assert "gguf" in fmt.exports and fmt.label == "nvfp4-ggml"
    quantize_(model, fmt)
    export_(model, "gguf", tmp_path, source=BUNDLED_DIR / "tiny-stdlib-llama")
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert down.tensor_type == gguf.GGMLQuantizationType.NVFP4
    theirs = gguf.quants.dequantize(down.data, down.tensor_type)
    ours = model.model.layers[0].mlp.down_proj.kernel.stored().dequantize().numpy()
    assert np.array_equal(theirs.reshape(ours.shape), ours)


@pytest.mark.parametrize("spec,why", [({"format": "nvfp4"}, "global scale"), ({"format": "mxfp8"}, "no ggml type")])
def test_nvfp4_and_mxfp8_are_refused_by_gguf_with_the_reason(spec: dict, why: str, tmp_path: Path) -> None:
    from quantlab import UnsupportedError

    fmt = build_format(spec)
    assert "gguf" not in fmt.exports and fmt.export_refusal("gguf")
    model = make_llama()
    quantize_(model, fmt)
    with pytest.raises(UnsupportedError, match=why):
        export_(model, "gguf", tmp_path)
