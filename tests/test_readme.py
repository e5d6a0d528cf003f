"""README and the documentation: the commands and examples they show run as written, and their links resolve."""
import re
import shutil
from pathlib import Path

import pytest
import yaml

from quantlab import load_recipe

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _block(path: Path, language: str, after: str = "") -> str:
    text = path.read_text()
    block = re.search(rf"{re.escape(after)}.*?```{language}\n(.*?)```", text, re.S)
    assert block is not None, (path, language, after)
    return block.group(1)


def test_the_readme_is_one_screen_of_guide_not_a_notebook() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert sum(line.startswith("```bash") for line in lines) == 2  # the two commands


def test_the_readme_recipe_is_a_valid_recipe_for_a_local_model(tmp_path: Path) -> None:
    text = _block(ROOT / "README.md", "yaml", "## A recipe")
    text = text.replace("{path: ./my-model, dtype: bfloat16}", "{bundled: tiny-stdlib-llama, dtype: bfloat16}")
    text = text.replace("./heldout.txt", "bundled-heldout")
    (tmp_path / "recipe.yaml").write_text(text)
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert len(recipe.variants()) == 4 * 2 and recipe.evaluations.perplexity.name == "kv-chunked"
    assert recipe.exports_for(recipe.variant_named("int4-g128-asym-gptq")) == ["gguf", "compressed-tensors"]
    assert len(text.strip().splitlines()) <= 15


def test_the_recipes_page_example_is_a_valid_recipe(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(_block(DOCS / "recipes.md", "yaml"))
    shutil.copytree(ROOT / "evals", tmp_path / "evals")  # the example names a local lm-eval task folder
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert len(recipe.variants()) == 12 * 6 and recipe.baseline_label == "fp32/kv-native"


def test_the_readme_and_docs_link_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(((?:examples|quantlab|docs)/[^)#]+)\)", (ROOT / "README.md").read_text()):
        assert (ROOT / target).is_file(), target
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", ""))["nav"]

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from pages(v)
        elif isinstance(node, list):
            for v in node:
                yield from pages(v)

    listed = set(pages(nav))
    written = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "reference" not in p.parts}
    assert written <= listed, written - listed  # every page is in the navigation
    assert {p for p in listed if not p.startswith("reference/")} <= written


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

    script = tmp_path / "example.py"
    script.write_text(_block(DOCS / "library.md", "python"))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ROOT / "reports" / "gptq-example" / "quantize_config.json").is_file()
