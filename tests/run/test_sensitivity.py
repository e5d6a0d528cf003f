"""``quantlab sensitivity``: one group at a time, ranked by divergence, with its heatmap; resumable."""
import csv
import json
from pathlib import Path

import pytest
import yaml

from quantlab.cli import main
from quantlab.run.recipe import load_recipe
from quantlab.run.sensitivity import ROWS_FILE, module_groups

RECIPE = {"name": "sens", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32", {"format": "int2", "group_size": 64}],
          "calibration": {"samples": 8, "seq_len": 128}, "device": "cpu"}


def _recipe(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**RECIPE, **changes}))
    return path


def _rows(out: Path) -> list[dict]:
    with open(out / "sensitivity.csv") as f:
        return list(csv.DictReader(f))


def test_groups_by_layer_module_type_and_module(tmp_path: Path) -> None:
    spec = load_recipe(_recipe(tmp_path)).model
    layers = module_groups(spec, "layer")
    assert [g.name for g in layers] == [f"layer {i}" for i in range(6)] and layers[2].patterns == ("model.layers.2.*",)
    assert len(layers[2].modules) == 7 and layers[2].first_layer == 2
    kinds = module_groups(spec, "module-type")
    assert [g.name for g in kinds] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert len(kinds[0].modules) == 6 and kinds[0].first_layer == 0
    modules = module_groups(spec, "module")
    assert len(modules) == 6 * 7 and (modules[8].layer, modules[8].kind) == (1, "k_proj")


@pytest.mark.slow  # a scan over every group, end to end: CI's slow tier
def test_sensitivity_ranks_every_group_and_draws_the_heatmap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["sensitivity", str(_recipe(tmp_path)), "--granularity", "module-type", "--max-tokens", "512",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "sensitivity.md")
    rows = _rows(out)
    assert len(rows) == 7 and all(float(r["kl_divergence_mean"]) > 0 for r in rows)
    kl = [float(r["kl_divergence_mean"]) for r in rows]
    assert kl == sorted(kl, reverse=True)
    assert {r["format"] for r in rows} == {"int2-g64-asym"}
    md = (out / "sensitivity.md").read_text()
    assert "<svg" in (out / "sensitivity.svg").read_text() and "| 1 |" in md and "508 tokens of stdlib-train" in md


@pytest.mark.slow  # two scans end to end; CI's slow tier runs it
def test_an_interrupted_sweep_resumes_from_its_rows_and_several_formats_share_one_table(tmp_path: Path, monkeypatch) -> None:
    import quantlab.quant.mixed.sensitivity as scan_module

    args = ["sensitivity", str(_recipe(tmp_path)), "--granularity", "layer", "--max-tokens", "256",
            "--format", "int2:group_size=64", "--format", "int8", "--out", str(tmp_path / "out")]
    scan = scan_module.scan
    seen = []

    def interrupted(*a, on_row, **k):
        def once(row):
            on_row(row)
            seen.append(row)
            if len(seen) == 5:
                raise KeyboardInterrupt
        return scan(*a, on_row=once, **k)

    monkeypatch.setattr(scan_module, "scan", interrupted)
    assert main(args) == 130  # interrupted: "run the same command again to resume"
    lines = (tmp_path / "out" / ROWS_FILE).read_text().splitlines()
    assert len(lines) == 5
    with open(tmp_path / "out" / ROWS_FILE, "a") as f:
        f.write('{"group": "layer')  # a write cut short by the interruption
    seen.clear()
    monkeypatch.setattr(scan_module, "scan", lambda *a, **k: scan(*a, on_row=lambda r: seen.append(r) or k["on_row"](r),
                                                                 **{x: y for x, y in k.items() if x != "on_row"}))
    assert main(args) == 0
    assert len(seen) == 12 - 5  # only the rest measured
    rows = _rows(tmp_path / "out")
    assert len(rows) == 12 and {r["format"] for r in rows} == {"int2-g64-asym", "int8-pc-asym"}
    by = {(r["group"], r["format"]): float(r["kl_divergence_mean"]) for r in rows}
    assert all(by[(g, "int8-pc-asym")] < by[(g, "int2-g64-asym")] for g, _ in by)
    # another token count is another stamp: everything is measured again, the old rows are not mixed in
    seen.clear()
    args[args.index("256")] = "128"
    assert main(args) == 0 and len(seen) == 12
    stamps = {json.loads(line)["stamp"]["scored_tokens"] for line in (tmp_path / "out" / ROWS_FILE).read_text().splitlines()}
    assert stamps == {2 * 127, 127}


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_the_table_feeds_a_mixed_format(tmp_path: Path) -> None:
    from quantlab import quantize_
    from quantlab.extend import WEIGHT_FORMATS
    from quantlab.models import load_model
    from quantlab.run.lifecycle import calibration_for

    out = tmp_path / "out"
    assert main(["sensitivity", str(_recipe(tmp_path)), "--granularity", "layer", "--max-tokens", "128",
                 "--format", "int8", "--format", "int2:group_size=64", "--out", str(out)]) == 0
    recipe = load_recipe(_recipe(tmp_path))
    loaded = load_model(recipe.model)
    fmt = WEIGHT_FORMATS["mixed"].build(candidates=["int8", {"format": "int2", "group_size": 64}], bits_per_weight=5,
                                        granularity="layer", sensitivity_path=str(out / "sensitivity.csv"))
    report = quantize_(loaded.model, fmt, calibration_for(recipe, loaded))
    by_layer = {n.split(".")[2]: d["format"] for n, d in report.details.items()}  # a layer takes one format
    assert len(report.details) == 42 and set(by_layer.values()) == {"int8-pc-asym", "int2-g64-asym"}
    assert all(d["format"] == by_layer[n.split(".")[2]] for n, d in report.details.items())


def test_a_recipe_without_a_second_format_needs_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sensitivity", str(_recipe(tmp_path, weights=["fp32"]))]) == 2
    assert "--format" in capsys.readouterr().err


def test_a_format_in_another_compute_dtype_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sensitivity", str(_recipe(tmp_path)), "--format", "int4:compute_dtype=bfloat16"]) == 2
    assert "compute dtype" in capsys.readouterr().err


@pytest.mark.slow  # end to end; CI's slow tier runs it
def test_a_format_that_keeps_the_models_dtype_sits_beside_a_cast_baseline(tmp_path: Path) -> None:
    path = _recipe(tmp_path, model={"bundled": "tiny-stdlib-llama", "dtype": "bfloat16"}, weights=["bf16", "int8"])
    assert main(["sensitivity", str(path), "--max-tokens", "128", "--out", str(tmp_path / "out")]) == 0
    assert len(_rows(tmp_path / "out")) == 6


def test_the_default_format_is_the_first_that_fits_beside_the_baseline() -> None:
    from quantlab import load_recipe
    from quantlab.run.sensitivity import beside_baseline

    root = Path(__file__).resolve().parents[2] / "recipes"
    assert beside_baseline(load_recipe(root / "quickstart.yaml")) == []  # every format there computes in bf16
    assert [f.label for f in beside_baseline(load_recipe(root / "mixed-precision.yaml"))][:1] == ["int8-pc-asym"]
    assert main(["sensitivity", str(root / "quickstart.yaml")]) == 2
