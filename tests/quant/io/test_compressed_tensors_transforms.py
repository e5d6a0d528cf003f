"""compressed-tensors export of weights rotated by ``hadamard``: the folder's transform_config, applied by
compressed-tensors' own transform factory (its online ``input`` hooks, the matrices read from the folder), runs the
logits quantlab measured; the same config fused by compressed-tensors into the float weights gives quantlab's
rotated weights; targets that cannot carry the rotation refuse it."""
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("compressed_tensors")

from quantlab import UnsupportedError, export_, quantize_  # noqa: E402
from quantlab.quant.format import build_format  # noqa: E402
from tests.conftest import make_llama  # noqa: E402

IDS = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
SHAPES = {"pow2": {}, "known-factor": dict(hidden_size=192, num_attention_heads=3, num_key_value_heads=3,
                                           intermediate_size=320)}  # inputs of 64 and 128; of 192 and 320


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits.float()


def _with_online_rotations(model, folder: Path) -> None:
    """What a loader of the folder's transform_config does: compressed-tensors' factory attaches each online
    transform (its ``input`` arguments; the ``weight_input`` ones are fused into the weights written), and the
    matrices are read from the folder, shared per scheme and size as transformers ties them."""
    from compressed_tensors.transform import TransformConfig, apply_transform_config
    from safetensors.torch import load_file

    config = TransformConfig.model_validate(
        json.loads((folder / "config.json").read_text())["quantization_config"]["transform_config"])
    for scheme in config.config_groups.values():
        scheme.apply = [a for a in scheme.apply if a.is_online()]
    apply_transform_config(model, config)
    written = {k: v for k, v in load_file(folder / "model.safetensors").items() if "_input.weight" in k}
    by_size = {(k.rsplit(".", 2)[-2], v.shape[0]): v for k, v in written.items()}
    for name, module in model.named_modules():
        for scheme in config.config_groups:
            t = getattr(module, f"{scheme}_input", None)
            if t is not None:
                t.weight.data.copy_(by_size[(f"{scheme}_input", t.weight.shape[0])])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("randomize", [False, True])
@pytest.mark.parametrize("block_size", [None, 32])
def test_the_exported_rotation_runs_the_measured_logits_through_compressed_tensors(
        shape: str, randomize: bool, block_size: int | None, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = make_llama(num_hidden_layers=2, **SHAPES[shape]).eval()
    fmt = build_format({"format": "int4", "group_size": 32, "symmetric": True, "transforms": [
        {"name": "hadamard", "randomize": randomize, "seed": 5, "block_size": block_size}]})
    assert "compressed-tensors" in fmt.exports and "gguf" not in fmt.exports
    quantize_(model, fmt)
    result = export_(model, "compressed-tensors", tmp_path)
    qconfig = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    schemes = qconfig["transform_config"]["config_groups"]
    sylvester = (shape == "pow2" or block_size is not None) and not randomize  # 32: a power of two
    assert [s["type"] for s in schemes.values()] == ["hadamard" if sylvester else "random-hadamard"]
    assert schemes["v"]["head_dim"] == block_size  # block-diagonal: each run of 32 inputs rotated alike
    linears = [n for n, _ in model.named_modules() if n.endswith("_proj")]
    assert sorted(schemes["v"]["apply"][0]["targets"]) == sorted(linears)
    from safetensors.torch import load_file

    written = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if "_input.weight" in k}
    assert len(written) == (2 if block_size is None else 1)  # one per size: (hidden, intermediate), or the block
    assert all(set(v.float().abs().unique().tolist()) == {1.0} for v in written.values())
    assert any("online input rotations" in n for n in result.notes)

    measured = _logits(model)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    unrotated = _logits(loaded)
    assert (unrotated - measured).abs().max() > 1e-2 * measured.abs().max()  # the weights alone are rotated
    _with_online_rotations(loaded, tmp_path)
    back = _logits(loaded)
    assert (back - measured).abs().max() <= 1e-4 * measured.abs().max()
    assert torch.equal(back.argmax(-1), measured.argmax(-1))


def test_compressed_tensors_fusing_the_config_gives_quantlabs_rotated_weights(tmp_path: Path) -> None:
    """The ``weight_input`` half, fused by compressed-tensors into the float weights with the written matrices,
    equals the weights quantlab rotated before rounding (a float cast keeps them); with the online half the model
    computes the unrotated model's logits."""
    import copy

    from compressed_tensors.transform import TransformConfig, TransformFactory

    model = make_llama(num_hidden_layers=2, **SHAPES["known-factor"]).eval()
    ours = copy.deepcopy(model)
    quantize_(ours, build_format({"format": "int8", "transforms": [{"name": "hadamard", "randomize": True}]}))
    export_(ours, "compressed-tensors", tmp_path)
    config = TransformConfig.model_validate(
        json.loads((tmp_path / "config.json").read_text())["quantization_config"]["transform_config"])
    rotated = {n: m.input_transform for n, m in ours.named_modules() if getattr(m, "input_transform", None)}
    theirs = copy.deepcopy(model)
    factory = TransformFactory.from_scheme(config.config_groups["v"], name="v")
    factory.weights.get = lambda size, factory_kwargs: torch.nn.Parameter(  # the written matrices, not fresh draws
        next(r.matrix() for r in rotated.values() if r.matrix().shape[0] == size).double(), requires_grad=False)
    factory.apply_to_model(theirs, use_tqdm=False)
    for name, module in model.named_modules():
        if name in rotated:
            want = module.weight.float() @ rotated[name](torch.eye(module.in_features))  # W Ĥ: rows of Ĥ are e_i Ĥ
            got = theirs.get_submodule(name).weight.float()
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    assert torch.allclose(_logits(theirs), _logits(model), atol=1e-4, rtol=1e-4)


def test_targets_that_cannot_carry_the_rotation_refuse_it(tmp_path: Path) -> None:
    fmt = build_format({"format": "int4", "group_size": 32, "transforms": ["hadamard"]})
    why = fmt.export_refusal("gptq")
    assert why is not None and "at run time" in why and "gptq" in why
    two = build_format({"format": "int8", "transforms": [{"name": "smoothquant", "others": "input-scale"}, "hadamard"]})
    assert "compressed-tensors" not in two.exports
    model = make_llama(num_hidden_layers=1)
    quantize_(model, build_format({"format": "int4", "group_size": 32, "symmetric": True, "transforms": ["hadamard"]}))
    with pytest.raises(UnsupportedError, match="model.layers.0.self_attn.q_proj: its input passes through an input "
                                               "rotation at run time, which gptq does not carry"):
        export_(model, "gptq", tmp_path / "gptq")
    assert not (tmp_path / "gptq").exists()  # refused before anything is written
