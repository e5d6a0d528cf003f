"""Engines are a registry: a recipe names registered engines, each says what it refuses and what it needs before any
work, and a new one is one class and one registration line, written here from outside the package."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantlab import RecipeError, validate_recipe
from quantlab.extend import ENGINES, DecodeResult, Engine

WORKLOAD = {"prompt_tokens": 8, "new_tokens": 3, "warmup_runs": 0, "prefill_repeats": 1}


class StepCounting(Engine):
    """A toy engine: the eager engine's generation, its steps counted and its name recorded."""

    in_process = True
    calls = 0

    def refuse(self, recipe: Any) -> tuple[str, str] | None:
        batches = recipe.workload.batch_size if isinstance(recipe.workload.batch_size, list) else [recipe.workload.batch_size]
        return ("workload.batch_size", "step-counting decodes one sequence") if max(batches) > 1 else None

    def decode(self, model: Any, kv: Any, device: Any, **workload: Any) -> DecodeResult:
        StepCounting.calls += 1
        result = ENGINES["eager"].build().decode(model, kv, device, **workload)
        result.engine, result.engine_options = "step-counting", {"steps": len(result.decode_ms)}
        return result

    def note(self, rows: list[dict[str, Any]], figure: str) -> str:
        counted = [r["variant"] for r in rows if r.get("engine") == "step-counting"]
        return f" Counted by the toy engine: {', '.join(counted)}." if counted and figure == "latency" else ""


@pytest.fixture
def toy_engine():
    ENGINES.add("step-counting", StepCounting, "a toy: eager decoding, steps counted")  # the one registration line
    yield
    ENGINES._entries.pop("step-counting")


def test_the_registry_holds_every_engine_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    assert {"auto", "eager", "compiled", "llama.cpp"} <= set(ENGINES.names())
    assert ENGINES["llama.cpp"].build().in_process is False and ENGINES["eager"].build().in_process is True
    with pytest.raises(RecipeError, match="unknown engine 'eagr'; did you mean 'eager'"):
        validate_recipe({"name": "x", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                         "workload": {**WORKLOAD, "engine": "eagr"}})


def test_a_new_engine_is_one_class_and_one_line_and_runs_beside_the_builtin_ones(toy_engine, tmp_path: Path) -> None:
    from quantlab import run_recipe
    from quantlab.report import load_rows

    spec = {"name": "toy", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"], "device": "cpu",
            "workload": {**WORKLOAD, "engine": ["eager", "step-counting"]}, "isolation": "none"}
    with pytest.raises(RecipeError, match="step-counting decodes one sequence"):
        validate_recipe({**spec, "workload": {**spec["workload"], "batch_size": [1, 2]}})
    recipe = validate_recipe(spec)
    assert [v.label for v in recipe.variants()] == ["fp32@eager", "fp32@step-counting"]
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    rows, _ = load_rows(out)
    assert StepCounting.calls == 1 and [r["engine"] for r in rows] == ["eager", "step-counting"]
    assert rows[1]["engine_options"] == {"steps": 3}
    assert "Counted by the toy engine: fp32@step-counting." in (out / "report.md").read_text()


def test_an_engine_that_cannot_run_here_is_refused_before_work(tmp_path: Path, monkeypatch) -> None:
    from quantlab.run.runner import check_against_model

    monkeypatch.setattr(ENGINES["llama.cpp"].cls, "missing", lambda self: "install it first")
    recipe = validate_recipe({"name": "x", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                              "workload": {**WORKLOAD, "engine": ["auto", "llama.cpp"]}})
    with pytest.raises(RecipeError, match="workload.engine: llama.cpp: install it first"):
        check_against_model(recipe)


def test_the_llama_cpp_engine_names_cache_types_and_no_kv_format_names_llama_cpp() -> None:
    import quantlab
    from quantlab.extend import KV_FORMATS

    llama = ENGINES["llama.cpp"].build()
    types = {name: llama.cache_type(KV_FORMATS[name].build()) for name in ("native", "fp16", "bf16", "fp32", "fp8",
                                                                              "int8")}
    assert types == {"native": "f16", "fp16": "f16", "bf16": "bf16", "fp32": "f32", "fp8": None, "int8": None}
    package = Path(quantlab.__file__).parent
    outside = [str(p.relative_to(package)) for p in package.rglob("*.py") if "engine" not in p.parts
               and "llama_cpp" in p.read_text()]
    assert outside == []  # nothing outside engine/ names llama.cpp's engine
