"""smoothquant: llm-compressor's scales (its ``_calculate_smoothing_scales``, recomputed here from its source:
``(max - min of the norm's output)^α / (2 max|W_j|)^(1-α)``, floored at 1e-5), folded into Llama's and Gemma's
norms; the transform alone leaves the logits unchanged; with int8 activations it lowers the error an outlier
channel causes; folded whole, it exports to compressed-tensors and loads with the measured logits."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from quantlab import export_, quantize_
from quantlab.quant.format import build_format
from tests.conftest import make_llama

SAMPLES = [torch.randint(0, 4096, (1, 48), generator=torch.Generator().manual_seed(i)) for i in range(3)]
IDS = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(9))


def _gemma() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=4096, hidden_size=256, intermediate_size=512,
                                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                              head_dim=128, sliding_window=64)).eval()


def _norm_output_ranges(model: torch.nn.Module, norm: torch.nn.Module) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    hook = norm.register_forward_hook(lambda m, a, out: seen.append(out.detach().reshape(-1, out.shape[-1])))
    with torch.no_grad():
        for ids in SAMPLES:
            model(input_ids=ids, use_cache=False)
    hook.remove()
    rows = torch.cat(seen)
    return rows.amax(0) - rows.amin(0)


@pytest.mark.parametrize("build,norm_attr,offset", [(make_llama, "input_layernorm", 0.0), (_gemma, "input_layernorm", 1.0)])
def test_the_scales_are_llm_compressors_folded_into_the_norm(build, norm_attr: str, offset: float) -> None:
    model = build()
    layer = model.model.layers[0]
    norm = getattr(layer, norm_attr)
    ranges = _norm_output_ranges(model, norm)
    before = {n: getattr(layer.self_attn, n).weight.detach().clone() for n in ("q_proj", "k_proj", "v_proj")}
    norm_before = norm.weight.detach().clone()
    weight_scales = 2.0 * torch.cat([w.abs().max(dim=0, keepdim=True)[0] for w in before.values()]).max(dim=0)[0]
    want = ranges.pow(0.8) / weight_scales.pow(1 - 0.8)
    want = torch.maximum(torch.where(weight_scales > 0.0, want, ranges), torch.tensor([1e-5]))
    quantize_(model, build_format({"format": "cast", "dtype": "float32",
                                   "transforms": [{"name": "smoothquant", "alpha": 0.8}]}), SAMPLES)
    for n, w in before.items():
        assert torch.allclose(getattr(layer.self_attn, n).weight, w * want, rtol=1e-6, atol=0), n
    assert torch.allclose(offset + norm.weight, (offset + norm_before) / want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("build", [make_llama, _gemma])
@pytest.mark.parametrize("others", ["input-scale", "skip"])
def test_the_transform_alone_leaves_the_logits_unchanged(build, others: str) -> None:
    model = build()
    with torch.no_grad():
        want = model(IDS).logits
    smoothed = copy.deepcopy(model)
    quantize_(smoothed, build_format({"format": "cast", "dtype": "float32",
                                      "transforms": [{"name": "smoothquant", "others": others}]}), SAMPLES)
    layer = smoothed.model.layers[0]
    assert not torch.allclose(layer.self_attn.q_proj.weight, model.model.layers[0].self_attn.q_proj.weight)
    scaled = getattr(layer.mlp.down_proj, "input_transform", None)
    assert (scaled is None) == (others == "skip")  # no norm before down_proj: an input scale, or left alone
    with torch.no_grad():
        assert torch.allclose(smoothed(IDS).logits, want, atol=5e-5, rtol=1e-4)


def _outlier_llama() -> torch.nn.Module:
    """Channel 5 of every norm output 40 times larger, the weights reading it 40 times smaller: the same model,
    with the activation outlier SmoothQuant was made for."""
    model = make_llama()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm, linears in ((layer.input_layernorm, (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                           layer.self_attn.v_proj)),
                                  (layer.post_attention_layernorm, (layer.mlp.gate_proj, layer.mlp.up_proj))):
                norm.weight[5] *= 40
                for lin in linears:
                    lin.weight[:, 5] /= 40
    return model


def test_with_int8_activations_it_lowers_what_an_outlier_channel_costs() -> None:
    model = _outlier_llama()
    with torch.no_grad():
        want = model(IDS).logits.log_softmax(-1)
    kl = {}
    for transforms in ([], [{"name": "smoothquant", "others": "skip"}]):
        q = copy.deepcopy(model)
        fmt = build_format({"format": "int8", "symmetric": True, "activations": "int8", "transforms": transforms})
        quantize_(q, fmt, SAMPLES if fmt.needs_calibration else None)
        with torch.no_grad():
            got = q(IDS).logits.log_softmax(-1)
        kl[bool(transforms)] = float(torch.nn.functional.kl_div(got, want, log_target=True, reduction="batchmean"))
    assert kl[True] < 0.5 * kl[False], kl


def test_labels_calibration_and_what_exports() -> None:
    folded = build_format({"format": "int8", "symmetric": True, "activations": "int8",
                           "transforms": [{"name": "smoothquant", "others": "skip"}]})
    assert folded.label == "int8-pc-sym-aint8-sq0.5n" and folded.needs_calibration
    assert "compressed-tensors" in folded.exports
    kept = build_format({"format": "int8", "activations": "int8", "transforms": ["smoothquant"]})
    assert kept.label.endswith("-sq0.5") and kept.exports == ()  # an input scale at run time: no target holds it
    with pytest.raises(ValueError, match="calibration"):
        quantize_(make_llama(), folded)


def test_w8a8_with_smoothquant_folded_loads_in_transformers_with_the_measured_logits(tmp_path: Path) -> None:
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    model = _outlier_llama()
    fmt = build_format({"format": "int8", "symmetric": True,
                        "activations": {"format": "int8", "scale_divisor": 127.5},
                        "transforms": [{"name": "smoothquant", "others": "skip"}]})
    quantize_(model, fmt, SAMPLES)
    export_(model, "compressed-tensors", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert all(g["input_activations"]["strategy"] == "token" for g in config["config_groups"].values())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        measured, back = model(IDS).logits, loaded(IDS).logits
    assert torch.allclose(back, measured, atol=1e-4, rtol=1e-4)  # the smoothed norms went with the weights
