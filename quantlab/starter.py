"""``quantlab init``: a commented starter recipe, or one of the recipes shipped with quantlab, written into a folder
so that an installed quantlab (no checkout) has something to run."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from .errors import QuantlabError
from .registry import UnknownNameError

PACKAGE = Path(__file__).parent
RECIPES_DIR = PACKAGE / "recipes"  # the shipped recipes (a checkout's recipes/ links here)
EVALS_DIR = PACKAGE / "evals"  # the shipped lm-eval tasks and model configs (a checkout's evals/)

STARTER = """\
# A quantlab recipe: which weight and KV-cache formats to compare on which model, how to measure them, and what
# the answer at the top of the report is judged by. `quantlab run {name}.yaml` measures every weight format with
# every KV format; `quantlab formats` lists the formats, protocols and export targets.
name: {name}                       # the run folder: reports/{name}/ (or quantlab run --out DIR)
model:
  bundled: tiny-stdlib-llama       # shipped with quantlab; your own:  path: ./my-model  (a folder with config.json
  dtype: float32                   # and the weights; relative paths are relative to this file) or  hub: org/name
weights:                           # the baseline first (see baseline: below), then the formats to compare
  - fp32
  - bf16
  - format: int8                   # round-to-nearest, one scale per output channel
  - {{format: int4, group_size: 128}}
  - {{format: gptq, bits: 4, group_size: 128}}   # calibrated on the text under calibration:
kv_cache:                          # each weight format is measured with each of these
  - native                         # the model's own cache, in its dtype
  - {{format: int8, residual_tokens: 16}}        # packed int8, the 16 most recent positions kept in full precision
workload:
  batch_size: 1
  prompt_tokens: 128               # or a list of context lengths: [128, 512]
  new_tokens: 32                   # decode steps timed after one warm-up generation
evaluations:
  perplexity: {{text: bundled-heldout, window_tokens: 256}}   # read through the KV cache (protocol kv-chunked)
  divergence: {{}}                   # KL from the baseline over the whole vocabulary, top-1 agreement, Δppl
calibration: {{text: stdlib-train, samples: 64, seq_len: 256}}
baseline: fp32
report:                            # what the report's answer is judged by
  kl_tolerance_nats: 0.01          # "within tolerance": mean KL from the baseline at most this
  budget_share: 0.5                # "best within budget": at most this share of the baseline's weights + KV bytes
"""


def shipped_recipes() -> dict[str, Path]:
    """The recipes shipped with quantlab, by name (their file stem)."""
    return {p.stem: p for p in sorted(RECIPES_DIR.glob("*.yaml"))}


def _target(folder: Path, name: str, force: bool) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise QuantlabError(f"init: {name!r} is not a recipe name (letters, digits, '.', '_', '-'; it names the run "
                            "folder too)")
    path = folder / f"{name}.yaml"
    if path.exists() and not force:
        raise QuantlabError(f"init: {path} exists; choose another name, or --force to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    return path


def write_starter(name: str, folder: Path, force: bool = False) -> Path:
    """A commented starter recipe named ``name`` in ``folder``."""
    path = _target(folder, name, force)
    path.write_text(STARTER.format(name=name), encoding="utf-8")
    return path


def rebase(text: str) -> str:
    """A shipped recipe's text as it reads from the folder it is written to: the shipped recipes sit one folder
    below the project's root, so a path value ``../x`` (a report or scan beside ``recipes/``) becomes ``x``."""
    return re.sub(r"(?<=: )\.\./", "", text)


def write_example(example: str, folder: Path, force: bool = False) -> tuple[Path, list[Path]]:
    """Shipped recipe ``example`` written into ``folder`` (its relative paths rebased), with the shipped lm-eval
    task folders it names copied beside it; returns the recipe's path and the folders copied."""
    recipes = shipped_recipes()
    if example not in recipes:
        raise QuantlabError(f"init: {UnknownNameError('example', example, list(recipes))}")
    path = _target(folder, example, force)
    text = rebase(recipes[example].read_text(encoding="utf-8"))
    copied = []
    for include in re.findall(r"include_path:\s*([^\s,}]+)", text):
        source = EVALS_DIR / Path(include).name
        if include.startswith("evals/") and source.is_dir() and not (folder / include).exists():
            shutil.copytree(source, folder / include)
            copied.append(folder / include)
    path.write_text(text, encoding="utf-8")
    return path, copied
