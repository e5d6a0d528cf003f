"""The library leaves its caller's process as it found it, and `import quantlab` stays cheap."""
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[1] / "quantlab"


def test_import_and_help_do_not_load_torch() -> None:
    probe = "import sys, quantlab, quantlab.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "quantlab.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "usage: quantlab" in proc.stdout
    assert time.perf_counter() - start < 2.0  # a generous bound: it takes a few hundredths of a second


def test_a_bad_recipe_fails_before_transformers_or_the_report_stack_load(tmp_path: Path) -> None:
    # Validating a recipe needs torch (the formats' configs), nothing heavier: transformers, pandas and matplotlib
    # (about 1.2 s of a 2.5 s error path on 2 cores) load only once a run starts.
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("name: bad\nmodel: {bundled: tiny-stdlib-llama}\nweights: [{format: int9}]\n")
    probe = ("import sys\nfrom quantlab.cli import main\ncode = main(['run', sys.argv[1]])\n"
             "print(code, sorted(m for m in ('transformers', 'pandas', 'matplotlib') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe, str(recipe)], capture_output=True, text=True)
    assert proc.stdout.split("\n")[0] == "2 []", proc.stdout + proc.stderr
    assert "unknown weight format 'int9'" in proc.stderr and "Traceback" not in proc.stderr


def test_the_public_names_load_on_first_use() -> None:
    import quantlab

    assert callable(quantlab.quantize_) and "int4" in quantlab.WEIGHT_FORMATS
    assert set(quantlab.__all__) <= set(dir(quantlab))


def test_no_module_changes_the_working_directory_or_global_logging() -> None:
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bos\.chdir\(|contextlib\.chdir\(", text), path
        assert "logging.basicConfig(" not in text, path


def test_loading_a_synthetic_model_leaves_the_global_rng_and_the_progress_bar_switch_alone(small_model_dir: Path) -> None:
    from transformers.utils import logging as hf_logging

    from quantlab.models import ModelSpec, load_model

    torch.manual_seed(1234)
    state, bar = torch.get_rng_state(), hf_logging.is_progress_bar_enabled()
    first = load_model(ModelSpec(config=str(small_model_dir / "config.json"), synthetic=True), seed=7).model
    assert torch.equal(torch.get_rng_state(), state) and hf_logging.is_progress_bar_enabled() == bar
    again = load_model(ModelSpec(config=str(small_model_dir / "config.json"), synthetic=True), seed=7).model
    assert torch.equal(first.model.layers[0].mlp.up_proj.weight, again.model.layers[0].mlp.up_proj.weight)
    load_model(ModelSpec(path=str(small_model_dir)))
    assert hf_logging.is_progress_bar_enabled() == bar
