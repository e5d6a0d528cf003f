"""compressed-tensors export: the library's own decompression gives back quantlab's numbers, and transformers'
compressed-tensors loader runs the folder to the logits quantlab measured."""
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("compressed_tensors")

from quantlab import UnsupportedError, export_, quantize_  # noqa: E402
from quantlab.extend import WEIGHT_FORMATS  # noqa: E402
from quantlab.quant.format import build_format  # noqa: E402
from tests.conftest import make_llama  # noqa: E402

IDS = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(0))


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


def _decompressed(folder: Path, module: str) -> torch.Tensor:
    """One module's weight as compressed-tensors' own compressor decompresses it."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    group = next(g for g in config["config_groups"].values() if module in g["targets"])
    tensors = {k[len(module) + 1:]: v for k, v in load_file(folder / "model.safetensors").items()
               if k.startswith(module + ".")}
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"])
    compressor = BaseCompressor.load_from_registry(group["format"])
    return compressor.decompress(tensors, scheme)["weight"].float()


FORMATS = {
    "int4-g32-asym": {"format": "int4", "group_size": 32},
    "int4-g64-sym": {"format": "int4", "group_size": 64, "symmetric": True},
    "int8-pc": {"format": "int8"},
    "int3-g64": {"format": "int3", "group_size": 64},
    "fp8-pc": {"format": "fp8"},
}


@pytest.mark.parametrize("name", FORMATS)
def test_the_librarys_decompression_gives_back_the_measured_weights(name: str, tmp_path: Path) -> None:
    spec = dict(FORMATS[name])
    model = make_llama()
    quantize_(model, WEIGHT_FORMATS[spec.pop("format")].build(**spec))
    export_(model, "compressed-tensors", tmp_path)
    layer = model.model.layers[1].mlp.down_proj
    ours = layer.kernel.stored().dequantize(torch.float32)
    theirs = _decompressed(tmp_path, "model.layers.1.mlp.down_proj")
    assert torch.equal(theirs, ours)


def test_a_mix_loads_in_transformers_with_each_modules_scheme(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    # Symmetric schemes: transformers 5.24 with compressed-tensors 0.20 cannot load asymmetric pack-quantized
    # folders (llm-compressor#1618: its meta-device model expects unpacked zero points), which are checked against
    # the library's own compressor below instead.
    model = make_llama()
    mix = WEIGHT_FORMATS["int4"].build(group_size=32, symmetric=True, overrides=[
        {"modules": "*.down_proj", "format": {"format": "int8", "symmetric": True}},
        {"modules": "*.v_proj", "format": {"format": "fp8"}}])
    quantize_(model, mix)
    export_(model, "compressed-tensors", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["format"] == "mixed-precision" and len(config["config_groups"]) == 3
    assert "lm_head" in config["ignore"]
    bits = {g["weights"]["num_bits"]: g for g in config["config_groups"].values() if g["weights"]["type"] == "int"}
    assert bits[8]["targets"] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    measured, back = _logits(model), _logits(loaded)
    assert (back - measured).abs().max() <= 1e-4 * measured.abs().max()


@pytest.mark.parametrize("bits,group_size", [(4, 32), (8, None), (3, 64)])
def test_asymmetric_tensors_are_what_the_librarys_own_compressor_writes(bits, group_size, tmp_path: Path) -> None:
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    model = make_llama()
    quantize_(model, WEIGHT_FORMATS["rtn"].build(bits=bits, group_size=group_size))
    export_(model, "compressed-tensors", tmp_path)
    name = "model.layers.0.mlp.gate_proj"
    q = model.get_submodule(name).kernel.stored()
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    group = next(g for g in config["config_groups"].values() if name in g["targets"])
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"])
    offset = 1 << (bits - 1)
    theirs = BaseCompressor.load_from_registry("pack-quantized").compress(
        {"weight": q.dequantize(torch.float32), "weight_scale": q.row_scales().float(),
         "weight_zero_point": (q.row_zero_points().to(torch.int16) - offset).to(torch.int8)}, scheme)
    ours = {k[len(name) + 1:]: v for k, v in load_file(tmp_path / "model.safetensors").items() if k.startswith(name + ".")}
    for key in ("weight_packed", "weight_zero_point", "weight_shape"):
        assert torch.equal(ours[key], theirs[key]), key


def test_codebooks_are_refused_naming_the_module(tmp_path: Path) -> None:
    model = make_llama()
    quantize_(model, WEIGHT_FORMATS["nf4"].build())
    with pytest.raises(UnsupportedError, match=r"model\.layers\.0\.self_attn\.q_proj: nf4 codebook.*no compressed-tensors form.*nearest"):
        export_(model, "compressed-tensors", tmp_path)


@pytest.mark.parametrize("spec", [{"format": "int4", "group_size": 32}, {"format": "int8"},
                                  {"format": "int4", "group_size": 32, "compute_dtype": "bfloat16"}])
def test_asymmetric_folders_load_in_transformers_dequantized_to_the_measured_logits(spec: dict, tmp_path: Path) -> None:
    """Asymmetric pack-quantized folders load through transformers' compressed-tensors path that dequantizes at load
    (``CompressedTensorsConfig(dequantize=True)``): its compressed path initializes unpacked zero points on the
    meta device (compressed-tensors 0.20.1's ``compress`` returns before packing them), a library bug."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    spec = dict(spec)
    model = make_llama()
    fmt = WEIGHT_FORMATS[spec.pop("format")].build(**spec)
    quantize_(model, fmt)
    result = export_(model, "compressed-tensors", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert [g["weights"]["symmetric"] for g in config["config_groups"].values()] == [False]
    assert any("dequantize=True" in note for note in result.notes)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype,
                                                  quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    measured, back = _logits(model), _logits(loaded)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2  # bf16 activations round the same sums differently
    assert (back - measured).abs().max() <= tolerance * measured.abs().max()
    assert (back.argmax(-1) == measured.argmax(-1)).float().mean() >= 0.99


def test_a_symmetric_format_computed_in_bf16_is_written_symmetric_and_loads(tmp_path: Path) -> None:
    """torch's int4 CPU kernel holds a zero point for every group; a symmetric tensor's (8 everywhere) is written
    as none, so the folder says symmetric and loads through the compressed path."""
    from transformers import AutoModelForCausalLM

    model = make_llama()
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=32, symmetric=True, compute_dtype="bfloat16"))
    assert model.model.layers[0].mlp.down_proj.kernel_path == "int4pack_mm_cpu"
    export_(model, "compressed-tensors", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert [g["weights"]["symmetric"] for g in config["config_groups"].values()] == [True]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    measured, back = _logits(model), _logits(loaded)
    assert (back.argmax(-1) == measured.argmax(-1)).float().mean() >= 0.99
    assert (back - measured).abs().max() <= 2e-2 * measured.abs().max()


def test_a_plan_s_mix_with_layers_kept_in_float_loads_with_the_measured_logits(tmp_path: Path) -> None:
    """A float base with quantized layers (what ``quantlab plan`` chooses): the float linears are ignored and
    written as they are, the others as their scheme."""
    from transformers import AutoModelForCausalLM

    model = make_llama()
    mix = build_format({"format": "cast", "dtype": "float32", "overrides": [
        {"modules": ["model.layers.1.*"], "format": "rtn", "bits": 4, "group_size": 32, "symmetric": True}]})
    assert "compressed-tensors" in mix.exports and "gguf" in mix.exports
    quantize_(model, mix)
    export_(model, "compressed-tensors", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    assert all(t.startswith("model.layers.1.") for t in group["targets"]) and len(group["targets"]) == 7
    assert "model.layers.0.mlp.down_proj" in config["ignore"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    measured, back = _logits(model), _logits(loaded)
    assert (back - measured).abs().max() <= 1e-4 * measured.abs().max()
