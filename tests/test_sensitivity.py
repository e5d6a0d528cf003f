"""``quantlab sensitivity``: one group at a time, ranked by divergence, with its heatmap."""
import csv
from pathlib import Path

import pytest
import yaml

from quantlab.cli import main
from quantlab.recipe import load_recipe
from quantlab.sensitivity import module_groups

RECIPE = {"name": "sens", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32", {"format": "int2", "group_size": 64}],
          "evaluations": {"perplexity": {"window_tokens": 128}}, "device": "cpu"}


def _recipe(tmp_path: Path) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    return path


def test_groups_by_layer_module_type_and_module(tmp_path: Path) -> None:
    spec = load_recipe(_recipe(tmp_path)).model
    layers = module_groups(spec, "layer")
    assert [g.name for g in layers] == [f"layer {i}" for i in range(6)] and layers[2].patterns == ("model.layers.2.*",)
    kinds = module_groups(spec, "module-type")
    assert [g.name for g in kinds] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    modules = module_groups(spec, "module")
    assert len(modules) == 6 * 7 and (modules[8].layer, modules[8].kind) == (1, "k_proj")


def test_sensitivity_ranks_every_layer_and_draws_the_heatmap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["sensitivity", str(_recipe(tmp_path)), "--granularity", "module-type", "--max-tokens", "1024",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "sensitivity.md")
    with open(out / "sensitivity.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 7 and all(float(r["kl_divergence_mean"]) > 0 for r in rows)
    kl = [float(r["kl_divergence_mean"]) for r in rows]
    assert kl == sorted(kl, reverse=True)
    assert rows[0]["variant"].startswith("int2-g64-asym-only:")
    assert "<svg" in (out / "sensitivity.svg").read_text() and "| 1 |" in (out / "sensitivity.md").read_text()
    records = sorted((out / "records").glob("*.json"))
    assert len(records) == 8  # the baseline and one variant per module type
    # Run again: every variant is reused, the table is the same.
    before = [p.stat().st_mtime_ns for p in records]
    assert main(["sensitivity", str(_recipe(tmp_path)), "--granularity", "module-type", "--max-tokens", "1024",
                 "--out", str(out)]) == 0
    assert [p.stat().st_mtime_ns for p in sorted((out / "records").glob("*.json"))] == before


def test_a_recipe_without_a_second_format_needs_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**RECIPE, "weights": ["fp32"]}))
    assert main(["sensitivity", str(path)]) == 2
    assert "--format" in capsys.readouterr().err
