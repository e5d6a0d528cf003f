"""The contract every registered weight format and KV-cache format keeps, checked on the bundled model: its
recipe form and label round-trip, it quantizes and runs, the bytes it holds equal its formula (and the estimate
from the config alone), and where it exports, the exported checkpoint loads back to the same logits.

A format takes part through its registration alone: its example instance is its class's ``example_fields``
(with the registered name's presets); ``example_fields = None`` says it needs files of its own (a published
checkpoint) and its own tests cover it."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import torch

from quantlab import calibration_from_text, load_gptq, quantize_, save_gptq
from quantlab.engine.memory import weight_bytes, weight_bytes_analytic
from quantlab.estimate.inventory import from_implementation
from quantlab.estimate.worksheet import weight_payload
from quantlab.extend import KV_FORMATS, WEIGHT_FORMATS
from quantlab.kv.hf_compat import cache_kwarg
from quantlab.models import ModelSpec, load_model
from quantlab.run.recipe import format_spec, resolve_format

CPU = torch.device("cpu")
PROMPT = torch.arange(1, 25).unsqueeze(0)


def _example(registry: Any, name: str) -> Any:
    return registry[name].example()


def _params(registry: Any) -> list[Any]:
    out = []
    for name in registry.names():
        cls = registry[name].cls
        # a library of its own, a calibration or a sensitivity scan: seconds each, so CI's slow tier runs them
        slow = getattr(cls, "slow_to_apply", False) or getattr(cls, "requires_calibration", False) or \
            bool(getattr(cls, "format_fields", ()))
        marks = [pytest.mark.slow] if slow else []
        if cls.example_fields is None:
            marks.append(pytest.mark.skip(reason=f"{name} needs files of its own; its own tests cover it"))
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    return load_model(ModelSpec(bundled="tiny-stdlib-llama"), CPU).tokenizer


def _bundled() -> Any:
    return load_model(ModelSpec(bundled="tiny-stdlib-llama"), CPU).model


def _calibration() -> Any:
    return calibration_from_text(_tokenizer(), "stdlib-train", samples=8, seq_len=64, seed=0)


def test_every_registered_format_declares_an_example_or_says_why_not() -> None:
    for registry in (WEIGHT_FORMATS, KV_FORMATS):
        for name in registry.names():
            assert hasattr(registry[name].cls, "example_fields"), name


@pytest.mark.parametrize("name", _params(WEIGHT_FORMATS))
def test_weight_format_recipe_form_and_label_round_trip(name: str) -> None:
    fmt = _example(WEIGHT_FORMATS, name)
    again = resolve_format(WEIGHT_FORMATS, format_spec(WEIGHT_FORMATS, fmt), "<test>", "weights[0]")
    assert again == fmt and again.label == fmt.label and fmt.label


@pytest.mark.parametrize("name", _params(WEIGHT_FORMATS))
def test_weight_format_quantizes_runs_and_holds_the_bytes_its_formula_says(name: str, tmp_path: Path) -> None:
    fmt = _example(WEIGHT_FORMATS, name)
    model = _bundled()
    base = next(model.parameters()).dtype
    config = model.config
    report = quantize_(model, fmt, _calibration() if fmt.needs_calibration else None)
    with torch.inference_mode():
        logits = model(input_ids=PROMPT).logits
    assert logits.shape == (1, PROMPT.shape[1], config.vocab_size) and torch.isfinite(logits).all()
    assert weight_bytes(model) == weight_bytes_analytic(model)
    try:
        estimated = weight_payload(from_implementation(config), fmt, base).bytes
    except NotImplementedError:  # a format without a formula from the config is reported as not estimated
        estimated = None
    if estimated is not None and fmt.estimate_is_exact:
        assert estimated == weight_bytes(model)
    elif estimated is not None:  # a lower bound: what only the model decides (AWQ's unfolded input scales) is small
        assert estimated <= weight_bytes(model) <= 1.01 * estimated
    if "gptq" in fmt.exports:
        assert report.replaced
        folder = save_gptq(model, tmp_path / "gptq")
        loaded = load_gptq(folder, dtype=torch.float32, kernels=["dequantize+matmul"])
        with torch.inference_mode():
            back = loaded(input_ids=PROMPT).logits
        assert torch.allclose(back, logits, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", _params(KV_FORMATS))
def test_kv_format_round_trips_decodes_and_holds_the_bytes_its_formula_says(name: str) -> None:
    kv = _example(KV_FORMATS, name)
    again = resolve_format(KV_FORMATS, format_spec(KV_FORMATS, kv), "<test>", "kv_cache[0]")
    assert again == kv and again.label == kv.label and kv.label
    model = _bundled()
    assert kv.check(model.config) is None
    cache = kv.make_cache(model.config)
    with torch.inference_mode():
        out = model.generate(PROMPT, max_new_tokens=8, do_sample=False, **{cache_kwarg(model): cache})
    assert out.shape == (1, PROMPT.shape[1] + 8)
    analytic = kv.cache_bytes_analytic(model.config, 1, PROMPT.shape[1] + 7, next(model.parameters()).dtype)
    if analytic is not None:  # None: a backend that decides its own layout
        assert kv.cache_bytes(cache) == analytic
