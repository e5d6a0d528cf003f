"""Executors are looked up by the recipe's executor.kind in a registry; an unknown one is refused up front."""
from pathlib import Path

import pytest

from quantlab import RecipeError, run_recipe, validate_recipe
from quantlab.extend import EXECUTORS, Sweep
from quantlab.run.recipe import ExecutorSpec


def test_the_built_in_executors_are_sweeps() -> None:
    assert EXECUTORS.names()[:2] == ["local", "ray"]
    assert all(issubclass(entry.cls, Sweep) for entry in EXECUTORS.entries())
    EXECUTORS["local"].cls.check_available(ExecutorSpec())  # the local one always can


def test_an_unknown_executor_is_a_recipe_error_naming_the_field_before_anything_is_written(tmp_path: Path) -> None:
    recipe = validate_recipe({"name": "e", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
                              "executor": {"kind": "slurm"}}, "e.yaml")
    with pytest.raises(RecipeError, match=r"^e\.yaml: executor\.kind: unknown executor 'slurm'.*known: local, ray"):
        run_recipe(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()
