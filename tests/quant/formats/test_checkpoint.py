"""Published checkpoints as variants: GPTQ folders (written by save_gptq) and AWQ GEMM folders (packed by
AutoAWQ's own code) loaded into the recipe model's layers."""
import json
from pathlib import Path

import pytest
import torch

from quantlab import QuantizedLinear, quantize_, quantize_tensor, save_gptq
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.formats.checkpoint import CheckpointSettings
from quantlab.quant.forms.affine.awq_layout import from_awq_tensors
from quantlab.quant.forms.affine.tensor import QuantizedTensor
from tests.conftest import make_llama


def _ids() -> torch.Tensor:
    return torch.randint(0, 4096, (1, 24), generator=torch.Generator().manual_seed(0))


def test_a_gptq_folder_loads_into_the_recipe_model(tmp_path: Path) -> None:
    quantized = make_llama()
    quantize_(quantized, WEIGHT_FORMATS["int4"].build(group_size=32, kernel="dequantize+matmul"))
    save_gptq(quantized, tmp_path / "model-GPTQ")
    fmt = WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "model-GPTQ"))
    assert fmt.label == "ckpt-gptq4-g32-model-GPTQ"
    base = make_llama()
    report = quantize_(base, fmt)
    assert len(report.replaced) == 2 * 7
    layer = base.model.layers[0].self_attn.q_proj
    assert isinstance(layer, QuantizedLinear) and layer.settings["method"] == "gptq"
    torch.testing.assert_close(layer.dequantize_weight(), quantized.model.layers[0].self_attn.q_proj.dequantize_weight())
    ids = _ids()
    torch.testing.assert_close(base(ids).logits, quantized(ids).logits, rtol=1e-3, atol=1e-3)  # fp16 scales
    assert layer.analytic_weight_bytes() == fmt.linear_weight_bytes(128, 128, torch.float32)


def test_checkpoint_tensors_that_are_not_quantized_replace_the_models(tmp_path: Path) -> None:
    """A folder's norms (which AWQ rescales) and embeddings are the ones used, not the base model's."""
    quantized = make_llama()
    quantized.model.layers[1].input_layernorm.weight.data *= 3
    quantize_(quantized, WEIGHT_FORMATS["int8"].build(kernel="dequantize+matmul"))
    save_gptq(quantized, tmp_path / "ckpt")
    base = make_llama()
    quantize_(base, WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "ckpt")))
    torch.testing.assert_close(base.model.layers[1].input_layernorm.weight, quantized.model.layers[1].input_layernorm.weight)


def _awq_gemm(linear: torch.nn.Linear, group_size: int):
    """AutoAWQ's packed layer for ``linear`` (its own packing code), from our 4-bit asymmetric scales and zeros."""
    gemm = pytest.importorskip("awq.modules.linear.gemm")
    q = quantize_tensor(linear.weight.data, 4, group_size)
    scales, zeros = q.scales.float().t().contiguous(), q.row_zero_points().float().t().contiguous()  # [groups, out]
    return gemm.WQLinear_GEMM.from_linear(linear, 4, group_size, scales=scales, zeros=zeros)


def test_awq_gemm_tensors_unpack_as_autoawq_dequantizes_them() -> None:
    packing = pytest.importorskip("awq.utils.packing_utils")
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64, bias=False)
    awq = _awq_gemm(linear, 64)
    ours = from_awq_tensors({"qweight": awq.qweight, "qzeros": awq.qzeros, "scales": awq.scales}, 4, 64)
    theirs = packing.dequantize_gemm(awq.qweight, awq.qzeros, awq.scales, 4, 64)  # [in, out]
    torch.testing.assert_close(ours.dequantize(), theirs.float().t(), rtol=2 ** -10, atol=0)  # theirs: fp16 math
    assert ours.nbytes == QuantizedTensor.analytic_nbytes((64, 256), 4, 64, False, 2)


def test_an_awq_folder_loads_into_the_recipe_model(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    source = make_llama()
    folder = tmp_path / "model-AWQ"
    folder.mkdir()
    tensors, expected = {}, {}
    for name, module in source.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            awq = _awq_gemm(module, 32)
            tensors.update({f"{name}.{k}": getattr(awq, k).contiguous() for k in ("qweight", "qzeros", "scales")})
            expected[name] = awq
    tensors.update({k: v.clone() for k, v in source.state_dict().items()
                    if not any(k.startswith(n + ".") for n in expected) and k != "lm_head.weight"})
    save_file(tensors, folder / "model.safetensors")
    config = source.config.to_dict()
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                                     "version": "gemm"}
    (folder / "config.json").write_text(json.dumps(config, default=str))
    fmt = WEIGHT_FORMATS["checkpoint"].build(path=str(folder))
    assert fmt.label == "ckpt-awq4-g32-model-AWQ"
    base = make_llama(num_hidden_layers=2)
    with torch.no_grad():
        for p in base.parameters():
            p.zero_()  # every tensor must come from the folder
    report = quantize_(base, fmt)
    assert sorted(report.replaced) == sorted(expected)
    packing = pytest.importorskip("awq.utils.packing_utils")
    for name, awq in expected.items():
        theirs = packing.dequantize_gemm(awq.qweight, awq.qzeros, awq.scales, 4, 32).float().t()
        torch.testing.assert_close(base.get_submodule(name).dequantize_weight(), theirs, rtol=2 ** -10, atol=0)
    torch.testing.assert_close(base.model.embed_tokens.weight, source.model.embed_tokens.weight)


def test_unreadable_folders_are_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a quantized checkpoint"):
        WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "plain"))
    (tmp_path / "gemv").mkdir()
    (tmp_path / "gemv" / "quant_config.json").write_text(json.dumps({"w_bit": 4, "q_group_size": 128, "version": "GEMV"}))
    with pytest.raises(ValueError, match="gemv"):
        WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "gemv"))
    (tmp_path / "exl2").mkdir()
    (tmp_path / "exl2" / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "exl2"}}))
    with pytest.raises(ValueError, match="exl2"):
        WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "exl2"))


def test_settings_are_read_from_autoawqs_quant_config(tmp_path: Path) -> None:
    (tmp_path / "quant_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": 128, "w_bit": 4,
                                                            "version": "GEMM"}))
    s = CheckpointSettings.read(tmp_path)
    assert (s.method, s.bits, s.group_size, s.symmetric, s.layout) == ("awq", 4, 128, False, "gemm")


def test_a_checkpoint_of_another_shape_is_refused(tmp_path: Path) -> None:
    from quantlab import UnsupportedError

    quantized = make_llama()
    quantize_(quantized, WEIGHT_FORMATS["int8"].build(kernel="dequantize+matmul"))
    save_gptq(quantized, tmp_path / "ckpt")
    with pytest.raises(UnsupportedError, match="in the checkpoint"):
        quantize_(make_llama(intermediate_size=512), WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path / "ckpt")))


def test_a_recipe_variant_names_the_folder_relative_to_the_recipe(tmp_path: Path) -> None:
    import yaml

    from quantlab import RecipeError, load_recipe

    quantized = make_llama()
    quantize_(quantized, WEIGHT_FORMATS["int8"].build(kernel="dequantize+matmul"))
    save_gptq(quantized, tmp_path / "ckpts" / "int8")
    recipe = {"name": "t", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32", {"format": "checkpoint",
                                                                                             "path": "ckpts/int8"}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert load_recipe(tmp_path / "r.yaml").variants()[1].label == "ckpt-gptq8-pc-int8"
    recipe["weights"][1]["path"] = "ckpts/missing"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match=r"weights\[1\].path: no such folder"):
        load_recipe(tmp_path / "r.yaml")


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_a_checkpoint_variant_runs_beside_the_one_quantized_in_the_run(small_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from quantlab import run_recipe, validate_recipe
    from quantlab.files import read_jsonl

    model = AutoModelForCausalLM.from_pretrained(small_model_dir)
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=32, kernel="dequantize+matmul"))
    save_gptq(model, tmp_path / "published")
    recipe = validate_recipe({
        "name": "ckpt", "model": {"path": str(small_model_dir)}, "isolation": "none", "device": "cpu",
        "weights": [{"format": "int4", "group_size": 32}, {"format": "checkpoint", "path": str(tmp_path / "published")}],
        "workload": {"batch_size": 1, "prompt_tokens": 8, "new_tokens": 2, "warmup_runs": 0, "prefill_repeats": 1, "engine": "eager"},
        "evaluations": {"perplexity": {"window_tokens": 64, "max_tokens": 512}}})
    rows = read_jsonl(run_recipe(recipe, tmp_path / "out", log=lambda _: None) / "results.jsonl")
    made, loaded = rows
    assert loaded["variant"] == "ckpt-gptq4-g32-published" and loaded["status"] == "ok"
    assert loaded["perplexity"] == pytest.approx(made["perplexity"], rel=1e-3)  # the same codes, fp16 scales
    assert loaded["weight_bytes"] == made["weight_bytes"]
