import re
import shutil
from pathlib import Path

from quantlab import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_recipe_example_is_a_valid_recipe(tmp_path: Path) -> None:
    block = re.search(r"## Recipes\n\n```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    (tmp_path / "recipe.yaml").write_text(block.group(1))
    shutil.copytree(ROOT / "evals", tmp_path / "evals")  # the example names a local lm-eval task folder
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert len(recipe.variants()) == 4 * 5 and recipe.baseline_label == "fp32/kv-native"
