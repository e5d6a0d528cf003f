"""A format that rounds its activations (W8A8, W4A4 with dynamic scales) exports to compressed-tensors with the
``input_activations`` of the preset that rounds the same way, and compressed-tensors' own forward rounding under
those arguments gives quantlab's rounded input bit for bit (float32 activations; compressed-tensors' fake
quantization of a bfloat16 input takes its scales in bfloat16, vLLM's kernels and quantlab in float32). What no
loader would round as measured is refused in one line: NVFP4's static input global scale, MX scales taken by
another rule, targets that hold weights alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantlab import export_, quantize_
from quantlab.errors import UnsupportedError
from quantlab.models import bundled_models
from quantlab.quant.activations import round_activations
from quantlab.quant.format import build_format

pytest.importorskip("compressed_tensors")

MX_ROUND = {"scale_rounding": "round"}
CASES = [  # (weight format, the preset whose input_activations it writes)
    ({"format": "mxfp8", "activations": {"format": "mxfp8", **MX_ROUND}}, "MXFP8"),
    ({"format": "mxfp4", "activations": {"format": "mxfp4", **MX_ROUND}}, "MXFP4"),
    ({"format": "fp8", "activations": "fp8"}, "FP8_DYNAMIC"),
    ({"format": "fp8", "block_size": 128, "activations": {"format": "fp8", "group_size": 128}}, "FP8_BLOCK"),
]


def _tiny() -> tuple[torch.nn.Module, object, Path]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = bundled_models()["tiny-stdlib-llama"]
    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(src), src


@pytest.mark.parametrize("spec,preset", CASES, ids=[p for _, p in CASES])
def test_the_written_input_activations_round_as_quantlab_measured(spec: dict, preset: str, tmp_path: Path) -> None:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStatus
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    model, tokenizer, src = _tiny()
    fmt = build_format(spec)
    assert "compressed-tensors" in fmt.exports
    quantize_(model, fmt)
    export_(model, "compressed-tensors", tmp_path, tokenizer=tokenizer, source=src)
    groups = json.loads((tmp_path / "config.json").read_text())["quantization_config"]["config_groups"]
    written = [g["input_activations"] for g in groups.values()]
    assert written and all(w == PRESET_SCHEMES[preset]["input_activations"].model_dump(mode="json") for w in written)
    args = QuantizationArgs.model_validate(written[0])
    layer = torch.nn.Linear(256, 4)
    layer.quantization_status = QuantizationStatus.FROZEN
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 256, generator=g) * torch.logspace(-2, 1, 256)  # features of every magnitude
    a = fmt.activations
    ours = round_activations(x, a.format, a.group_size, a.scale_rounding)
    assert torch.equal(forward_quantize(layer, x, "input", args), ours)
    assert not torch.equal(ours, x)


@pytest.mark.parametrize("spec,to,why", [
    ({"format": "nvfp4", "activations": "nvfp4"}, "compressed-tensors", "static input_global_scale"),
    ({"format": "mxfp4", "activations": "mxfp4"}, "compressed-tensors", "scale_rounding: round"),
    ({"format": "mxfp4", "activations": {"format": "mxfp4", **MX_ROUND}}, "gguf", "gguf holds weights alone"),
])
def test_what_no_loader_would_round_as_measured_is_refused(spec: dict, to: str, why: str, tmp_path: Path) -> None:
    fmt = build_format(spec)
    assert to not in fmt.exports and why in fmt.export_refusal(to)
    model, tokenizer, src = _tiny()
    quantize_(model, fmt)
    with pytest.raises(UnsupportedError, match=why):
        export_(model, to, tmp_path, tokenizer=tokenizer, source=src)
    assert not (tmp_path / "config.json").exists()  # refused before anything is written


def test_scale_rounding_is_refused_where_there_are_no_e8m0_scales() -> None:
    with pytest.raises(ValueError, match="scale_rounding is for mxfp4 and mxfp8"):
        build_format({"format": "fp8", "activations": {"format": "fp8", "scale_rounding": "round"}})
    assert build_format(CASES[0][0]).label.endswith("amxfp8-round")
