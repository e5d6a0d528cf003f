"""Run a recipe: check it against the model, join or start a sweep of its run folder, and let the recipe's
executor measure each variant nobody has measured, one record each. Any number of runs of one recipe can fill one
folder together. The views (reports, tables) are the report package's, built from the records after a run
(``quantlab.api.run_recipe``, ``quantlab run``, ``quantlab report``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import QuantlabError, RecipeError
from ..estimate.model import config_estimate
from ..files import MANIFEST_FILE, atomic_write_text
from ..measurements import enabled_measurements
from ..models import gguf_tensor_types, load_config, weight_files_problem
from ..records.fingerprint import describe, machine_fingerprint
from ..records.folder import RunFolder
from .executors import EXECUTORS
from .recipe import ExecutorSpec, Recipe
from .sweep import Log, Retime, Sweep, which_retime


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def executor_class(recipe: Recipe, executor: ExecutorSpec) -> type[Sweep]:
    """The registered executor ``executor.kind`` names, checked to be able to run here."""
    try:
        cls = EXECUTORS[executor.kind].cls
    except QuantlabError as e:
        raise RecipeError(recipe.source, "executor.kind", str(e)) from None
    cls.check_available(executor)
    return cls


def position_limit(recipe: Recipe, config: Any) -> tuple[int | None, str]:
    """The model's position limit and where it comes from (the config field that states it)."""
    estimate = config_estimate(recipe.model)
    fact = estimate.architecture.row("position limit") if estimate else None
    if fact is not None and fact.value:
        return int(fact.value), f"{fact.kind} field {fact.source}" if fact.kind == "file" else f"{fact.kind}: {fact.source}"
    limit = getattr(config, "max_position_embeddings", None)
    return (int(limit), "config max_position_embeddings") if limit else (None, "")


def _check_lengths(recipe: Recipe, config: Any) -> None:
    """Refuse a workload, perplexity window or calibration length beyond the model's position limit."""
    limit, source = position_limit(recipe, config)
    if limit is None:
        return
    workload = recipe.workload
    prompt, new = max(p for _, p in workload.points()), workload.new_tokens
    if prompt + new > limit:
        raise RecipeError(recipe.source, "workload.prompt_tokens", f"{prompt} + new_tokens {new} = "
                          f"{prompt + new} positions exceed the model's position limit {limit} ({source})")
    ppl = recipe.evaluations.perplexity
    if ppl is not None and ppl.window_tokens > limit:
        raise RecipeError(recipe.source, "evaluations.perplexity.window_tokens",
                          f"{ppl.window_tokens} exceeds the model's position limit {limit} ({source})")
    if any(w.needs_calibration for w in recipe.weights) and recipe.calibration.seq_len > limit:
        raise RecipeError(recipe.source, "calibration.seq_len",
                          f"{recipe.calibration.seq_len} exceeds the model's position limit {limit} ({source})")


def check_against_model(recipe: Recipe) -> None:
    """Fail before writing anything if the model cannot be found, a weight or KV format does not fit it or lacks
    the package it needs, or the workload asks for more positions than it has."""
    if recipe.device == "cuda" and not torch.cuda.is_available():
        raise RecipeError(recipe.source, "device", "cuda, but torch sees no CUDA device here; use auto or cpu")
    for i, weight in enumerate(recipe.weights):
        missing = weight.missing_dependency()
        if missing:
            raise RecipeError(recipe.source, f"weights[{i}]", f"{weight.label}: {missing}")
    for i, kv in enumerate(recipe.kv_cache):
        missing = kv.missing_dependency()
        if missing:
            raise RecipeError(recipe.source, f"kv_cache[{i}]", missing)
    config = load_config(recipe.model)
    problem = weight_files_problem(recipe.model)
    if problem:
        raise RecipeError(recipe.source, f"model.{recipe.model.source_field}", problem)
    for i, kv in enumerate(recipe.kv_cache):
        problem = kv.check(config)
        if problem:
            raise RecipeError(recipe.source, f"kv_cache[{i}]", f"{kv.label}: {problem}")
    _check_weights(recipe, config)
    _check_lengths(recipe, config)
    _check_kv_positions(recipe)
    _check_tasks(recipe)
    _check_engines(recipe)


def _check_engines(recipe: Recipe) -> None:
    """Every engine the workload names can run here (what an engine outside this process needs is installed)."""
    from ..engine import ENGINES

    for name in recipe.workload.engines:
        missing = ENGINES[name].build().missing()
        if missing:
            raise RecipeError(recipe.source, "workload.engine", f"{name}: {missing}")


def _check_kv_positions(recipe: Recipe) -> None:
    """A KV format whose full-precision residual covers every position the run puts in a cache is refused."""
    positions = max(p for _, p in recipe.workload.points()) + recipe.workload.new_tokens
    ppl = recipe.evaluations.perplexity
    if ppl is not None and ppl.reads_kv_cache:
        positions = max(positions, ppl.window_tokens)
    for i, kv in enumerate(recipe.kv_cache):
        problem = kv.check_positions(positions)
        if problem is not None:
            where, message = problem
            raise RecipeError(recipe.source, f"kv_cache[{i}]{where}", message)


def kv_residual_warnings(recipe: Recipe) -> list[str]:
    """A line for each KV format that keeps at least half the workload's cached positions in full precision: its
    bytes and quality would mostly show its unquantized window (the report notes it on the rows too)."""
    prompt = min(p for _, p in recipe.workload.points())
    positions = prompt + recipe.workload.new_tokens
    out = []
    for i, kv in enumerate(recipe.kv_cache):
        kept = kv.full_precision_tokens(positions)
        if kept is not None and kept >= positions / 2:
            out.append(f"warning: kv_cache[{i}] ({kv.label}) keeps {kept} of the {positions} positions of the shortest "
                       "decode point in full precision (residual_tokens): its bytes and quality will mostly show that "
                       "window; lower residual_tokens or lengthen prompt_tokens")
    return out


def _check_tasks(recipe: Recipe) -> None:
    """Every evaluation can run here as the recipe writes it (its package installed, its tasks found)."""
    for name, config in recipe.evaluations.items():
        problem = config.problem()
        if problem:
            where, why = problem
            raise RecipeError(recipe.source, f"evaluations.{name}{where}", why)


def _check_weights(recipe: Recipe, config: Any) -> None:
    """Each weight format against the model's linears, from the config's estimate (meta device, no weights read)."""
    from ..dtypes import DTYPES
    from ..models import model_dtype_name

    estimate = config_estimate(recipe.model)  # the run's own estimate (cached): its inventory, not a second one
    inventory = estimate.inventory if estimate is not None else None
    if inventory is None:  # an architecture that cannot be built on meta: checked at run time
        return
    linears = {t.name.rsplit(".", 1)[0]: (t.shape[0], t.shape[1]) for t in inventory.tensors if t.quantizable}
    base = DTYPES[model_dtype_name(recipe.model, config)]
    for i, weight in enumerate(recipe.weights):
        problem = weight.check_model(linears, inventory.head_module, base)
        if problem is not None:
            where, message = problem
            raise RecipeError(recipe.source, f"weights[{i}]{where}", message)


def _manifest(recipe: Recipe, sweep: int) -> dict[str, Any]:
    """The run's description; views add ``complete`` and the fingerprints their rows were measured under."""
    estimate = config_estimate(recipe.model)
    variants = recipe.variants()
    return {
        "recipe": recipe.to_spec(), "recipe_file": recipe.source, "baseline": recipe.baseline_label,
        "variant_keys": [v.key for v in variants],
        "variants": [v.label for v in variants], "complete": False, "sweep": sweep,
        "measurements": [name for name, _ in enabled_measurements(recipe)],
        "model_evidence": [vars(e) for e in estimate.architecture.evidence] if estimate else [],
        **({"model_gguf_tensor_types": types} if (types := gguf_tensor_types(recipe.model)) else {}),
    }


def _with_earlier_variants(out_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """``--add``: the folder's earlier variants stay in its manifest (and so in its reports) before this recipe's."""
    path = out_dir / MANIFEST_FILE
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    keys, labels = list(earlier.get("variant_keys") or []), list(earlier.get("variants") or [])
    for key, label in zip(manifest["variant_keys"], manifest["variants"]):
        if key not in keys:
            keys.append(key)
            labels.append(label)
    recipes = list(dict.fromkeys([*(earlier.get("recipes") or [(earlier.get("recipe") or {}).get("name")]),
                                  manifest["recipe"]["name"]]))
    return {**manifest, "variant_keys": keys, "variants": labels, "recipes": [r for r in recipes if r]}


def _drop_shared_weights(out_dir: Path, log: Log) -> None:
    """Every variant is recorded: the quantized weights kept for reuse between them go (they can be large)."""
    import shutil

    from .lifecycle import SHARED_WEIGHTS

    kept = out_dir / SHARED_WEIGHTS
    if kept.is_dir():
        freed = sum(f.stat().st_size for f in kept.glob("*.pt"))
        shutil.rmtree(kept, ignore_errors=True)
        log(f"removed the quantized weights kept for reuse between variants ({freed / 2**20:.1f} MiB)")


def run_recipe(recipe: Recipe, out_dir: Path | None = None, *, log: Log = _stderr,
               shard: tuple[int, int] | None = None, executor: ExecutorSpec | None = None,
               retime: Retime | bool | None = None, add: bool = False, rounds: int = 1) -> Path:
    """Measure every variant of ``recipe`` that ``out_dir`` has no usable record of (sharing the work with any
    other process running into the same folder), writing a record each. Returns ``out_dir``.

    ``shard=(i, n)``: only the variants whose key falls in shard ``i`` of ``n`` (array jobs: ``n`` such runs,
    anywhere, into one shared folder measure every variant once; ``quantlab report`` then builds the report).
    ``executor``: where the variants run (default: the recipe's ``executor``, local unless it says ray).
    ``retime``: measure again the decode timing of earlier records, keeping their other figures: ``"noisy"`` (or
    True) those flagged noisy, ``"all"`` every one (after the engine or its kernels changed).
    ``add``: the folder may hold another recipe's records; this recipe's variants are added beside them.
    ``rounds`` > 1 (with ``retime``): the variants to time again are held together in this process and timed in that
    many interleaved rounds (``run.interleave``), after any variant never measured is measured as usual."""

    out_dir = Path(out_dir or Path("reports") / recipe.name)
    executor = executor or recipe.executor
    sweep_class = executor_class(recipe, executor)  # an unknown or missing engine: an error before anything is written
    earlier = other_recipes(out_dir, recipe)
    if earlier and not add:
        raise QuantlabError(f"{out_dir}: holds the records of recipe {', '.join(repr(n) for n in earlier)}, not "
                            f"{recipe.name!r}; give this run another --out, or --add to report both recipes' "
                            "variants in one folder")
    _check_rounds(rounds, retime, shard, sweep_class)
    check_against_model(recipe)
    with recipe.threads_applied():  # the machine fingerprint records the threads the variants run with
        return _run(recipe, out_dir, executor, sweep_class, log, shard, retime, add, rounds)


def _check_rounds(rounds: int, retime: Retime | bool | None, shard: tuple[int, int] | None, sweep_class: Any) -> None:
    """``--rounds``: a count, with ``--retime``, in one process (not a shard, not an executor that spreads variants)."""
    if rounds < 1:
        raise QuantlabError(f"--rounds: a number of rounds, at least 1 (got {rounds})")
    if rounds == 1:
        return
    if not retime:
        raise QuantlabError(f"--rounds {rounds}: times the folder's measured variants again, together; give "
                            "--retime all (or --retime noisy) with it")
    if shard is not None or sweep_class is not Sweep:
        raise QuantlabError(f"--rounds {rounds}: the variants are timed together in this process; not with --shard "
                            "or an executor that measures them elsewhere (use the local executor)")


def other_recipes(out_dir: Path, recipe: Recipe) -> list[str]:
    """The names of recipes other than ``recipe`` whose records ``out_dir`` holds (a recipe renamed counts as another)."""
    folder = RunFolder(out_dir)
    if not out_dir.is_dir():
        return []
    names = {str(r.get("recipe")) for r in folder.records().values() if r.get("recipe")}
    return sorted(names - {recipe.name})


def _run(recipe: Recipe, out_dir: Path, executor: ExecutorSpec, sweep_class: Any, log: Log,
         shard: tuple[int, int] | None, retime: Retime | bool | None = None, add: bool = False,
         rounds: int = 1) -> Path:
    folder = RunFolder(out_dir)
    folder.check_writable()
    folder.convert_legacy(log)
    sweep, started = folder.join_or_start_sweep()
    log(f"{'started' if started else 'joined'} sweep {sweep} in {out_dir} on {describe(machine_fingerprint())}")
    manifest = _manifest(recipe, sweep)
    if add:
        manifest = _with_earlier_variants(out_dir, manifest)
    atomic_write_text(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=1))
    for line in kv_residual_warnings(recipe):
        log(line)
    which = which_retime(retime)
    together = rounds > 1 and which is not None
    share = (sweep_class(recipe, folder, sweep, log, shard, executor, retime=None, keep_measured=True) if together
             else sweep_class(recipe, folder, sweep, log, shard, executor, retime=retime))
    share.run()
    if together:
        from .interleave import retime_interleaved

        retime_interleaved(recipe, folder, sweep, log, which, rounds)
    if share.all_recorded():
        folder.complete_sweep(sweep)
        _drop_shared_weights(out_dir, log)
    else:
        log(f"shard {shard[0]}/{shard[1]} done; other shards' variants are still missing (quantlab report {out_dir} "
            "once every shard has finished)" if shard else "some variants are still missing")
    return out_dir
