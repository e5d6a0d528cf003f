"""The library leaves its caller's process as it found it, and `import quantlab` stays cheap."""
import re
import subprocess
import sys
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[1] / "quantlab"


def test_import_and_help_do_not_load_torch() -> None:
    probe = "import sys, quantlab, quantlab.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    probe = ("import sys\nfrom quantlab.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert "usage: quantlab" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "[]"  # its speed:
    # benchmarks/cli_startup.py


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


def test_every_public_name_loads_on_first_use() -> None:
    import quantlab
    import quantlab.extend

    for module in (quantlab, quantlab.extend):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
    assert "int4" in quantlab.extend.WEIGHT_FORMATS and "windows" in quantlab.extend.PERPLEXITY_PROTOCOLS
    assert {"local", "ray"} <= set(quantlab.extend.EXECUTORS.names())


def test_the_format_classes_are_the_configs_the_registry_builds() -> None:
    from quantlab import FP8, GPTQ, HQQ, NF4, RTN, KVInt, Mixed, NativeKV
    from quantlab.extend import KV_FORMATS, WEIGHT_FORMATS

    assert RTN(bits=4, group_size=128) == WEIGHT_FORMATS["int4"].build(group_size=128)
    assert GPTQ(bits=4, group_size=128, act_order=True) == WEIGHT_FORMATS["gptq"].build(bits=4, group_size=128,
                                                                                         act_order=True)
    assert NF4() == WEIGHT_FORMATS["nf4"].build() and NF4().label == "nf4-b64"
    assert HQQ(bits=4).label == WEIGHT_FORMATS["hqq"].build(bits=4).label and FP8().label == "fp8-e4m3-pc"
    assert Mixed(candidates=[RTN(bits=8), RTN(bits=4, group_size=128)], bits_per_weight=6).candidates[0] == RTN(bits=8)
    assert KVInt(bits=4) == KV_FORMATS["int4"].build() and NativeKV() == KV_FORMATS["native"].build()


def test_calibration_from_text_is_the_recipes_calibration(small_model_dir: Path) -> None:
    from quantlab import calibration_from_text, validate_recipe
    from quantlab.models import load_model
    from quantlab.run.lifecycle import calibration_for

    loaded = load_model(validate_recipe({"name": "c", "model": {"path": str(small_model_dir)}, "weights": ["fp32"]}).model)
    recipe = validate_recipe({"name": "c", "model": {"path": str(small_model_dir)}, "weights": ["fp32"],
                              "calibration": {"text": "bundled-heldout", "samples": 3, "seq_len": 32, "seed": 5}})
    ours = calibration_from_text(loaded.tokenizer, "bundled-heldout", samples=3, seq_len=32, seed=5)
    assert [s.tolist() for s in ours] == [s.tolist() for s in calibration_for(recipe, loaded)]
    inline = calibration_from_text(loaded.tokenizer, "def f(x):\n    return x + 1\n" * 40, samples=2, seq_len=16)
    assert len(inline) == 2 and all(s.shape == (1, 16) for s in inline)


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
