"""Budgeted mixed precision: the budget holds, the choice beats the uniform format, tables are reused."""
import copy
import math
from pathlib import Path

import pytest
import torch

from quantlab import QuantlabError, quantize_
from quantlab.engine.memory import weight_bytes_by_component
from quantlab.extend import WEIGHT_FORMATS
from quantlab.fidelity.divergence import compare, reference
from quantlab.quant.format import Calibration
from tests.conftest import make_llama

CPU = torch.device("cpu")
INT8, INT4, INT3 = "int8", {"format": "int4", "group_size": 128}, {"format": "int3", "group_size": 128}


def _mixed(**fields):
    return WEIGHT_FORMATS["mixed"].build(**{"candidates": [INT8, INT4, INT3], **fields})


def _random_calibration(n: int = 4, seq: int = 64) -> Calibration:
    g = torch.Generator().manual_seed(0)
    return Calibration([torch.randint(0, 4096, (1, seq), generator=g) for _ in range(n)])


def test_fields_label_and_spec_round_trip() -> None:
    f = _mixed(budget_format=INT4)
    assert f.label == "mixed:as-int4-g128-asym[int8-pc-asym,int4-g128-asym,int3-g128-asym]"
    assert _mixed(bits_per_weight=4.5, granularity="layer").label.startswith("mixed:4.5bpw-by-layer[")
    assert _mixed(budget_bytes=52_300_000).budget_label == "52.3MB"
    spec = f.model_dump(mode="json", exclude_defaults=True)
    assert spec["candidates"][1] == {"format": "rtn", "bits": 4, "group_size": 128}
    assert WEIGHT_FORMATS["mixed"].build(**spec) == f


@pytest.mark.parametrize("fields, message", [
    ({}, "exactly one of budget_bytes"),
    ({"budget_bytes": 10, "bits_per_weight": 4}, "exactly one of budget_bytes"),
    ({"bits_per_weight": 4, "candidates": [INT8, INT8]}, "repeat a format"),
    ({"bits_per_weight": 4, "candidates": [INT8, {**INT4, "overrides": [{"modules": "*", "format": "int8"}]}]},
     "a plain format"),
    ({"bits_per_weight": 4, "candidates": [INT8, {"format": "int4", "compute_dtype": "bfloat16"}]}, "same compute_dtype"),
    ({"bits_per_weight": 4, "overrides": [{"modules": "*", "format": "int8"}]}, "not overrides"),
])
def test_inconsistent_fields_are_refused(fields, message) -> None:
    with pytest.raises(Exception, match=message):
        WEIGHT_FORMATS["mixed"].build(**{"candidates": [INT8, INT4, INT3], **fields})


def test_a_recipe_names_the_entry_when_mixed_is_wrong(tmp_path: Path) -> None:
    from quantlab import RecipeError, validate_recipe

    spec = {"name": "m", "model": {"bundled": "tiny-stdlib-llama"},
            "weights": ["fp32", {"format": "mixed", "candidates": [INT8, INT4]}]}
    with pytest.raises(RecipeError, match=r"weights\[1\].*exactly one of budget_bytes"):
        validate_recipe(spec)
    spec["weights"][1].update(bits_per_weight=5, candidates=["int9", INT4])
    with pytest.raises(RecipeError, match=r"weights\[1\].candidates\[0\].format: unknown weight format 'int9'"):
        validate_recipe(spec)
    spec["weights"][1]["candidates"] = [INT8, {**INT4, "grup_size": 3}]
    with pytest.raises(RecipeError, match=r"weights\[1\].candidates\[1\].grup_size: .*did you mean 'group_size'"):
        validate_recipe(spec)
    spec["weights"][1].update(candidates=[INT8, INT4], sensitivity_path="tables/s.csv")
    recipe = validate_recipe(spec, base_dir=tmp_path)
    assert recipe.weights[1].sensitivity_path == str(tmp_path / "tables" / "s.csv")


def test_the_budget_holds_and_every_linear_gets_a_candidate(tmp_path: Path) -> None:
    model = make_llama()
    fmt = _mixed(bits_per_weight=4.0, scan_tokens=128)
    report = quantize_(model, fmt, _random_calibration())
    linears = [m for m in model.modules() if hasattr(m, "dequantize_weight")]
    assert len(report.replaced) == len(linears) == 14
    formats = {d["format"] for d in report.details.values()}
    assert formats <= {"int8-pc-asym", "int4-g128-asym", "int3-g128-asym"} and len(formats) >= 2
    weights = sum(m.out_features * m.in_features for m in linears)
    assert weight_bytes_by_component(model)["quantized_linear"] <= 4.0 * weights / 8


def test_a_budget_that_fits_the_largest_candidate_everywhere_takes_it() -> None:
    model = make_llama()
    report = quantize_(model, _mixed(bits_per_weight=9, scan_tokens=128), _random_calibration())
    assert {d["format"] for d in report.details.values()} == {"int8-pc-asym"}


def test_a_budget_below_the_smallest_candidates_fails_with_one_line() -> None:
    with pytest.raises(QuantlabError, match="below the smallest possible total"):
        quantize_(make_llama(), _mixed(bits_per_weight=2, scan_tokens=128), _random_calibration())


def test_the_scan_is_written_to_sensitivity_path_and_read_back(tmp_path: Path, monkeypatch) -> None:
    import quantlab.quant.mixed.sensitivity as sensitivity

    path = tmp_path / "tables" / "sens.csv"
    first = quantize_(make_llama(), _mixed(bits_per_weight=4.5, scan_tokens=128, sensitivity_path=str(path)),
                      _random_calibration())
    assert path.is_file() and len(path.read_text().splitlines()) == 1 + 14 * 3
    monkeypatch.setattr(sensitivity, "scan", lambda *a, **k: pytest.fail("scanned again"))
    second = quantize_(make_llama(), _mixed(bits_per_weight=4.5, scan_tokens=128, sensitivity_path=str(path)),
                       _random_calibration())
    assert {n: d["format"] for n, d in first.details.items()} == {n: d["format"] for n, d in second.details.items()}
    # a table without one of the candidates is refused, naming the file
    other = WEIGHT_FORMATS["mixed"].build(candidates=[INT8, {"format": "int2", "group_size": 64}], bits_per_weight=4.5,
                                          sensitivity_path=str(path))
    with pytest.raises(QuantlabError, match=r"sens.csv: no divergence for .* in int2-g64-asym"):
        quantize_(make_llama(), other, _random_calibration())


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_at_the_bytes_of_int4_g128_the_mix_diverges_less_than_int4_g128_on_the_bundled_model() -> None:
    from quantlab.data import calibration_samples, load_text
    from quantlab.eval.tokens import tokenize
    from quantlab.models import load_model
    from quantlab.run.recipe import ModelSpec

    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"))
    calibration = Calibration(calibration_samples(tokenize(loaded.tokenizer, load_text("stdlib-train")), 8, 256, seed=0))
    held_out = tokenize(loaded.tokenizer, load_text("bundled-heldout"))[:4096]
    ref = reference(loaded.model, held_out, 256, 4, CPU, 128, what=None)
    results = {}
    for fmt in (WEIGHT_FORMATS["int4"].build(group_size=128), _mixed(budget_format=INT4, scan_tokens=1024)):
        model = copy.deepcopy(loaded.model)
        quantize_(model, fmt, calibration)
        results[fmt.scheme_label.split(":")[0]] = (weight_bytes_by_component(model)["quantized_linear"],
                                                   compare(model, held_out, ref, 4, CPU, what=None)["kl_divergence_mean"])
    (uniform_bytes, uniform_kl), (mixed_bytes, mixed_kl) = results["int4-g128-asym"], results["mixed"]
    assert mixed_bytes <= uniform_bytes
    assert mixed_kl < 0.9 * uniform_kl


@pytest.mark.parametrize("tied", [True, False])
def test_the_output_head_joins_the_choice_and_keeping_a_tied_one_costs_nothing(tied: bool) -> None:
    fmt = _mixed(bits_per_weight=4.5, scan_tokens=128, head=True, granularity="layer",
                 candidates=[INT8, INT4, {"format": "gptq", "bits": 4, "group_size": 64}])
    assert fmt.label.startswith("mixed:4.5bpw-by-layer+head[") and not fmt.calibrates_head
    model = make_llama(tie_word_embeddings=tied)
    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head)
    budget = math.floor(4.5 * (body + head.weight.numel()) / 8)
    report = quantize_(model, fmt, _random_calibration())
    quantized_head = "lm_head" in report.replaced
    if quantized_head:  # never in the calibrated candidate
        assert report.details["lm_head"]["format"] in {"int8-pc-asym", "int4-g128-asym"}
    linear_bytes = weight_bytes_by_component(model)["quantized_linear"]
    kept_bytes = 0 if tied or quantized_head else head.weight.numel() * 4
    assert linear_bytes + kept_bytes <= budget
    if tied:  # the head's share of the budget buys more bits for the body: every body linear in int8
        assert not quantized_head
        assert {d["format"] for d in report.details.values()} == {"int8-pc-asym"}


def test_the_head_needs_a_candidate_without_calibration() -> None:
    with pytest.raises(Exception, match="head: the output head takes only formats without calibration"):
        _mixed(bits_per_weight=4, head=True, candidates=[{"format": "gptq", "bits": 4}, {"format": "gptq", "bits": 3}])


def test_at_layer_granularity_the_head_is_a_group_of_its_own() -> None:
    from quantlab.quant.mixed.groups import group_linears

    model = make_llama()
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    groups = group_linears(model, names, "layer")
    assert [g.name for g in groups] == ["layer 0", "layer 1", "lm_head"]
    assert groups[-1].modules == ("lm_head",) and groups[-1].first_layer is None
    kinds = {g.name: g.patterns for g in group_linears(model, names, "module-type")}
    assert "lm_head" in kinds["lm_head"]


def test_export_to_admits_only_candidates_that_write_to_the_target_exactly() -> None:
    q8, q4 = {"format": "int8", "group_size": 32, "symmetric": True}, {"format": "int4", "group_size": 32}
    fmt = WEIGHT_FORMATS["mixed"].build(candidates=[q8, q4], bits_per_weight=5.0, export_to="gguf")
    assert "gguf" in fmt.exports and "gptq" not in fmt.exports
    with pytest.raises(ValueError, match="candidate int8-pc-asym does not export to it"):
        WEIGHT_FORMATS["mixed"].build(candidates=["int8", q4], bits_per_weight=5.0, export_to="gguf")
    with pytest.raises(ValueError, match="candidate nf4-b64 does not export"):
        WEIGHT_FORMATS["mixed"].build(candidates=[q4, "nf4"], bits_per_weight=5.0, export_to="compressed-tensors")
    with pytest.raises(ValueError, match="unknown export target 'onnx'"):
        WEIGHT_FORMATS["mixed"].build(candidates=[q8, q4], bits_per_weight=5.0, export_to="onnx")
