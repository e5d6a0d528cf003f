"""`quantlab init`: a starter recipe that validates, and the shipped examples written where a user stands, their
relative paths pointing where they pointed from the checkout's recipes/ folder."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from quantlab.cli import main
from quantlab.starter import RECIPES_DIR, rebase, shipped_recipes

ROOT = Path(__file__).resolve().parents[1]


def test_the_starter_recipe_validates_and_runs_every_weight_format_with_every_kv_format(tmp_path: Path, capsys) -> None:
    from quantlab import load_recipe

    assert main(["init", "mine", "--dir", str(tmp_path)]) == 0
    path = tmp_path / "mine.yaml"
    assert capsys.readouterr().out.strip() == str(path)
    recipe = load_recipe(path)
    assert recipe.name == "mine" and len(recipe.variants()) == 5 * 2 and recipe.baseline_label == "fp32/kv-native"
    assert recipe.evaluations.divergence is not None and recipe.report.kl_tolerance_nats == 0.01
    assert sum(line.strip().startswith("#") or "  # " in line for line in path.read_text().splitlines()) >= 10
    assert main(["init", "mine", "--dir", str(tmp_path)]) == 2  # an existing file is not replaced...
    assert "exists; choose another name, or --force" in capsys.readouterr().err
    assert main(["init", "mine", "--dir", str(tmp_path), "--force"]) == 0  # ...unless asked


def test_the_checkout_recipes_folder_is_the_shipped_one() -> None:
    assert (ROOT / "recipes").resolve() == RECIPES_DIR.resolve() and (ROOT / "evals" / "configs").is_dir()
    assert set(shipped_recipes()) >= {"quickstart", "smollm2-135m", "gemma3-270m", "kv-formats"}


@pytest.mark.parametrize("example", sorted(shipped_recipes()))
def test_an_example_written_elsewhere_points_where_it_pointed_from_the_checkout(example: str, tmp_path: Path,
                                                                               capsys) -> None:
    assert main(["init", "--example", example, "--dir", str(tmp_path)]) == 0
    written = yaml.safe_load((tmp_path / f"{example}.yaml").read_text())
    original = yaml.safe_load((RECIPES_DIR / f"{example}.yaml").read_text())

    def paths(node, out):  # every relative file path a recipe names
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str) and (k.endswith("_path") or k in ("path", "text")) and "/" in v:
                    out.append(v)
                paths(v, out)
        elif isinstance(node, list):
            for v in node:
                paths(v, out)
        return out

    for before, after in zip(paths(original, []), paths(written, []), strict=True):
        from_checkout = os.path.normpath(os.path.join("recipes", before))  # as resolved from ROOT/recipes/
        assert from_checkout == os.path.normpath(after), (before, after)  # as resolved from the written file
    assert {k: v for k, v in written.items() if k != "weights"} == \
        {k: v for k, v in yaml.safe_load(rebase((RECIPES_DIR / f"{example}.yaml").read_text())).items() if k != "weights"}


def test_an_unknown_example_is_one_line_with_the_nearest_name(tmp_path: Path, capsys) -> None:
    assert main(["init", "--example", "quickstrat", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean 'quickstart'?" in err and not list(tmp_path.iterdir())


def test_list_names_every_shipped_example(capsys) -> None:
    assert main(["init", "--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == list(shipped_recipes())


def test_rebase_drops_one_level_of_parent_only_from_path_values() -> None:
    text = "a: ../reports/x.csv\n  - {format: gguf, imatrix_path: ../reports/i.gguf}\n# see ../README\n"
    assert rebase(text) == "a: reports/x.csv\n  - {format: gguf, imatrix_path: reports/i.gguf}\n# see ../README\n"
    assert re.search(r": \.\./", rebase((RECIPES_DIR / "gguf-types.yaml").read_text())) is None
