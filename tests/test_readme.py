import re
import shutil
from pathlib import Path

import pytest

from quantlab import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_recipe_example_is_a_valid_recipe(tmp_path: Path) -> None:
    block = re.search(r"## Recipes\n\n```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    (tmp_path / "recipe.yaml").write_text(block.group(1))
    shutil.copytree(ROOT / "evals", tmp_path / "evals")  # the example names a local lm-eval task folder
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert len(recipe.variants()) == 9 * 5 and recipe.baseline_label == "fp32/kv-native"


def test_the_readme_links_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(((?:examples|quantlab)/[^)#]+)\)", (ROOT / "README.md").read_text()):
        assert (ROOT / target).is_file(), target


def test_the_quickstart_writes_only_git_ignored_files() -> None:
    """A fresh clone's quickstart measures every variant (no committed results in its folder) and leaves
    `git status` clean (its folder is ignored)."""
    import subprocess

    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    folder = f"reports/{recipe.name}"
    tracked = subprocess.run(["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert tracked.stdout == ""
    for name in ("records/0123456789abcdef.json", "claims/k.0.json", "report.md", "results.jsonl", "manifest.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{folder}/{name}"], cwd=ROOT)
        assert ignored.returncode == 0, name


@pytest.mark.slow
def test_the_library_example_runs_as_written(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    block = re.search(r"## The library\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    script = tmp_path / "example.py"
    script.write_text(block.group(1))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ROOT / "reports" / "gptq-example" / "quantize_config.json").is_file()
