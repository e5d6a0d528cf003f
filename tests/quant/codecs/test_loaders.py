"""Every (stored form, target) pair a codec claims is loaded by the target's own loader and gives the logits quantlab
measured, on the bundled model, symmetric and asymmetric where the form has both: compressed-tensors folders by
transformers with compressed-tensors, GGUF files by transformers' GGUF loader (gguf-py, llama.cpp's reference
decoder; llama.cpp itself runs them in tests/engine/llama_cpp), GPTQ and AWQ folders by GPTQModel. A codec
registered without a case here fails the first test, so a new pair is never claimed untested."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from quantlab import export_, quantize_
from quantlab.models import bundled_models
from quantlab.quant.codecs import CODECS
from quantlab.quant.format import build_format
from quantlab.quant.forms.affine import FloatZeroTensor
from quantlab.quant.io.export import quantized_linears
from quantlab.quant.kernels.base import DequantKernel
from quantlab.quant.linear import QuantizedLinear

INT4_ASYM = {"format": "int4", "group_size": 32, "kernel": "dequantize+matmul"}
WHOLE_ZEROS = "whole-zeros"  # int4 asymmetric codes held as float zero points that are whole numbers

CASES: dict[tuple[str, str], list[dict[str, Any] | str]] = {
    ("compressed-tensors", "affine"): [{**INT4_ASYM, "symmetric": True}, INT4_ASYM, {"format": "int8"},
                                       {"format": "int8", "symmetric": True}],
    ("compressed-tensors", "float_zero"): [WHOLE_ZEROS],
    ("compressed-tensors", "float8"): [{"format": "fp8"}, {"format": "fp8", "block_size": 128}],
    ("compressed-tensors", "mx"): [{"format": "mxfp4"}, {"format": "mxfp8"}],
    ("compressed-tensors", "nvfp4"): [{"format": "nvfp4"}],
    ("compressed-tensors", "dense"): [{"format": "fp32"}, {"format": "bf16"}],  # a plain checkpoint
    ("gguf", "affine"): [{**INT4_ASYM, "symmetric": True}, INT4_ASYM, {"format": "rtn", "bits": 5, "group_size": 32},
                         {"format": "int8", "group_size": 32, "symmetric": True}],  # Q4_0, Q4_1, Q5_1, Q8_0
    ("gguf", "float_zero"): [{"format": "int4", "group_size": 32, "zero_point": "float"}],
    ("gguf", "ggml"): [{"format": "gguf", "type": "Q4_K"}, {"format": "gguf", "type": "Q6_K"}],
    ("gguf", "mx"): [{"format": "mxfp4"}],
    ("gguf", "nvfp4"): [{"format": "nvfp4", "arithmetic": "ggml"}],
    ("gguf", "dense"): [{"format": "fp32"}, {"format": "bf16"}],
    ("gptq", "affine"): [{**INT4_ASYM, "symmetric": True}, INT4_ASYM, {"format": "int8", "group_size": 64}],
    ("gptq", "float_zero"): [WHOLE_ZEROS],
    ("awq", "affine"): [{**INT4_ASYM, "symmetric": True}, INT4_ASYM],
    ("awq", "float_zero"): [WHOLE_ZEROS],
}
FORM_OF_SPEC = {"fp32": "dense", "bf16": "dense"}


def test_every_codec_that_writes_has_a_loader_case() -> None:
    claimed = {key for key, codec in CODECS.items() if codec.writes}
    assert claimed == set(CASES), f"codecs without a loader case: {sorted(claimed - set(CASES))}; " \
                                  f"cases without a codec: {sorted(set(CASES) - claimed)}"


def _model(dtype: torch.dtype) -> tuple[torch.nn.Module, Any, Path]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = bundled_models()["tiny-stdlib-llama"]
    return AutoModelForCausalLM.from_pretrained(src, dtype=dtype).eval(), AutoTokenizer.from_pretrained(src), src


def _as_whole_float_zeros(model: torch.nn.Module) -> None:
    """Each integer-coded layer held as float zero points with the same (whole) values."""
    for _, layer in model.named_modules():
        if isinstance(layer, QuantizedLinear):
            q = layer.kernel.stored()
            zeros = q.row_zero_points().to(q.scales.dtype)
            layer.kernel = DequantKernel(FloatZeroTensor(q.packed, q.scales, zeros, q.shape, q.bits, q.group_size))


def _compressed_tensors(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    import json

    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    if "quantization_config" not in json.loads((folder / "config.json").read_text()):  # nothing quantized
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype,
                                                quantization_config=CompressedTensorsConfig(dequantize=True))


def _gguf(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf", dtype=dtype)


def _gptqmodel(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    pytest.importorskip("gptqmodel")
    from gptqmodel import GPTQModel

    return GPTQModel.load(str(folder), device="cpu", dtype=dtype).model


LOADERS: dict[str, tuple[Callable[[Path, torch.dtype], torch.nn.Module], torch.dtype]] = {
    "compressed-tensors": (_compressed_tensors, torch.float32), "gguf": (_gguf, torch.float32),
    "gptq": (_gptqmodel, torch.float16), "awq": (_gptqmodel, torch.float16),
}


def _id(spec: dict[str, Any] | str) -> str:
    return spec if isinstance(spec, str) else "-".join(f"{k}={x}" for k, x in spec.items() if k != "kernel")


SLOW_LOADERS = ("gptq", "awq")  # GPTQModel picks and checks a kernel per layer: seconds each, in the slow tier
SLOW_CASES = {("gguf", "affine", 2), ("gguf", "affine", 3), ("gguf", "ggml", 1), ("gguf", "dense", 1)}  # (.., index)


def _slow(target: str, form: str, index: int) -> bool:
    return target in SLOW_LOADERS or (target, form, index) in SLOW_CASES


@pytest.mark.parametrize("target,form,spec", [
    pytest.param(t, f, s, id=f"{t}-{f}-{_id(s)}", marks=[pytest.mark.slow] if _slow(t, f, i) else [])
    for (t, f), specs in CASES.items() for i, s in enumerate(specs)])
def test_the_targets_own_loader_gives_the_measured_logits(target: str, form: str, spec: dict | str,
                                                          tmp_path: Path) -> None:
    if target in ("compressed-tensors",):
        pytest.importorskip("compressed_tensors")
    if target == "gguf":
        pytest.importorskip("gguf")
    load, dtype = LOADERS[target]
    model, tokenizer, src = _model(dtype)
    fmt = build_format(INT4_ASYM if spec == WHOLE_ZEROS else spec)
    quantize_(model, fmt)
    if spec == WHOLE_ZEROS:
        _as_whole_float_zeros(model)
    else:
        assert target in fmt.exports  # the config's claim, derived from its forms' codecs
    forms = {lw.stored.form for lw in quantized_linears(model)} or {FORM_OF_SPEC.get(fmt.label, "?")}
    assert forms == {form}
    export_(model, target, tmp_path, tokenizer=tokenizer, source=src)
    ids = tokenizer(Path(src, "README.md").read_text()[:2000] if Path(src, "README.md").exists() else "def f(x):\n"
                    "    return x + 1\n" * 40, return_tensors="pt")["input_ids"][:, :128]
    with torch.no_grad():
        ref = model(ids).logits.float()
        got = load(tmp_path, dtype).eval()(ids).logits.float()
    error = ((got - ref).norm() / ref.norm()).item()
    top1 = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    # the written numbers are the measured ones (scales cast to the target's dtype at most); float16 loaders round
    assert error < (2e-2 if dtype == torch.float16 else 5e-3) and top1 >= 0.97, (error, top1)
