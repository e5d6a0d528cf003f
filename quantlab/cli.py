"""The ``quantlab`` command: run | report | compare | estimate | sensitivity | plan | export | init | formats."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .entrypoints import quiet_import_noise
from .errors import QuantlabError


def _run(args: argparse.Namespace) -> int:
    from .run.recipe import load_recipe

    recipe = load_recipe(args.recipe)  # a bad recipe fails here, before the runner and reports are imported
    from .api import run_recipe
    from .report import load_rows, run_summary

    if args.threads:
        recipe = recipe.with_threads(args.threads)
    executor = None
    if args.executor or args.address:
        fields = {"kind": args.executor or recipe.executor.kind, **({"address": args.address} if args.address else {})}
        executor = recipe.executor.model_copy(update=fields)
    out = run_recipe(recipe, args.out, shard=parse_shard(args.shard) if args.shard else None, executor=executor,
                     retime=args.retime, add=args.add, rounds=args.rounds)
    try:
        rows, _ = load_rows(out)
    except QuantlabError:  # a shard with no variant of its own in an empty folder
        print(f"quantlab: no results in {out} yet", file=sys.stderr)
        return 0
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        print(f"quantlab: {len(failed)} of {len(rows)} variants failed (the report lists them): "
              + "; ".join(f"{r['variant']}: {r.get('error')}" for r in failed), file=sys.stderr)
    print(run_summary(out), flush=True)
    return 1 if failed else 0


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/8"`` -> ``(2, 8)``: shard 2 of 8, counted from 0 (Slurm's array task id, Kubernetes' completion index)."""
    i, sep, n = text.partition("/")
    if not (sep and i.strip().isdigit() and n.strip().isdigit() and 0 <= int(i) < int(n)):
        raise QuantlabError(f"--shard: expected I/N with 0 <= I < N, e.g. 0/4 (got {text!r})")
    return int(i), int(n)


def _report(args: argparse.Namespace) -> int:
    from .report import write_report

    if not Path(args.dir).is_dir():
        raise QuantlabError(f"{args.dir}: no such results folder")
    if args.paired:
        from .report import load_rows
        from .report.paired import paired_between

        rows, _ = load_rows(Path(args.dir))
        print(paired_between(rows, *args.paired).text())
        return 0
    try:
        path = write_report(Path(args.dir), log=lambda msg: print(f"quantlab: {msg}", file=sys.stderr))
        if args.summary:
            from .report import run_summary

            print(run_summary(Path(args.dir)))
        else:
            print(path)
    except PermissionError as e:
        raise QuantlabError(f"{args.dir}: cannot write the views there ({e.strerror}: {e.filename}); copy the folder "
                            "somewhere writable or ask for write permission") from None
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .report.compare import compare_runs

    print(compare_runs([Path(d) for d in args.dirs], args.out, log=lambda msg: print(f"quantlab: {msg}", file=sys.stderr)))
    return 0


def _sensitivity(args: argparse.Namespace) -> int:
    from .quant import WEIGHT_FORMATS
    from .run.recipe import load_recipe, resolve_format

    recipe = load_recipe(args.recipe)
    if args.format:
        formats = [resolve_format(WEIGHT_FORMATS, parse_format_spec(f), "--format", f) for f in args.format]
    else:
        from .run.sensitivity import beside_baseline

        formats = beside_baseline(recipe)[:1]
        if not formats:
            raise QuantlabError(f"{args.recipe}: no weight format of the recipe keeps the baseline's compute dtype and "
                                "module selection (sensitivity swaps one group at a time into the baseline); name one "
                                "with --format, e.g. --format int4:group_size=128")
    if args.max_tokens < 2:
        raise QuantlabError("--max-tokens must be at least 2")
    from .run.sensitivity import run_sensitivity

    name = "+".join(f.label for f in formats)
    out = args.out or Path("reports") / f"{recipe.name}-sensitivity-{name}-{args.granularity}"
    from .report.sensitivity import write_tables

    result = run_sensitivity(recipe, formats, args.granularity, out, args.max_tokens,
                             log=lambda msg: print(f"quantlab: {msg}", file=sys.stderr))
    write_tables(out, result)
    print(out / "sensitivity.md")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from .estimate.fit import parse_bytes
    from .plan.command import run_plan
    from .run.recipe import PlanSpec, load_recipe

    recipe = load_recipe(args.recipe)
    given = {"memory_bytes": parse_bytes(args.memory, "--memory") if args.memory else None,
             "context_tokens": args.context, "batch_size": args.batch, "kv_group_layers": args.kv_group_layers,
             "measure": False if args.no_measure else None}
    for flag, value in (("--context", args.context), ("--batch", args.batch), ("--kv-group-layers", args.kv_group_layers)):
        if value is not None and value < 1:
            raise QuantlabError(f"{flag} must be at least 1 (got {value})")
    fields = {**(recipe.plan.model_dump() if recipe.plan else {}), **{k: v for k, v in given.items() if v is not None}}
    for name, flag in (("memory_bytes", "--memory"), ("context_tokens", "--context")):
        if name not in fields:
            raise QuantlabError(f"{recipe.source}: plan.{name}: give {flag} or a plan: section with {name}")
    spec = PlanSpec(**fields)
    out = args.out or Path("reports") / f"{recipe.name}-plan"
    path = run_plan(recipe, spec, out, log=lambda msg: print(f"quantlab: {msg}", file=sys.stderr))
    print(path)
    return 0


def _export(args: argparse.Namespace) -> int:
    from .run.export import export_from_run

    result = export_from_run(Path(args.dir), args.variant, args.to, args.out)
    for note in result.notes:
        print(f"quantlab: {note}", file=sys.stderr)
    deviation = result.max_abs_deviation
    print(f"quantlab: wrote {', '.join(result.files)} ({len(result.tensors)} tensors; largest deviation from the "
          f"measured weights {deviation:.3g})", file=sys.stderr)
    print(result.folder)
    return 0


def _init(args: argparse.Namespace) -> int:
    from .starter import shipped_recipes, write_example, write_starter

    if args.list:
        for name, path in shipped_recipes().items():
            first = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip()
            print(f"{name:<22} {first}")
        return 0
    folder = Path(args.dir)
    if args.example:
        path, copied = write_example(args.example, folder, args.force)
        if args.name:
            print(f"quantlab: --example keeps the example's own name ({args.example})", file=sys.stderr)
        for c in copied:
            print(f"quantlab: copied the lm-eval tasks it names to {c}", file=sys.stderr)
    else:
        path = write_starter(args.name or "my-recipe", folder, args.force)
    print(f"quantlab: wrote {path}; measure it with: quantlab run {path}", file=sys.stderr)
    print(path)
    return 0


def _formats(args: argparse.Namespace) -> int:
    from .engine import ENGINES
    from .eval.base import EVALUATIONS
    from .eval.perplexity import PERPLEXITY_PROTOCOLS
    from .kv import KV_FORMATS
    from .measurements import MEASUREMENTS  # noqa: F401  (registers the evaluations)
    from .quant import WEIGHT_FORMATS
    from .quant.kernels import KERNELS
    from .quant.transforms import TRANSFORMS
    from .run.executors import EXECUTORS

    kernels = _cpu_kernels(WEIGHT_FORMATS) if args.kernels else {}
    from .quant.io import EXPORTERS

    for registry in (WEIGHT_FORMATS, TRANSFORMS, KV_FORMATS, ENGINES, EVALUATIONS, PERPLEXITY_PROTOCOLS, EXECUTORS,
                     EXPORTERS):
        print(f"{registry.kind}s:")
        for entry in registry.entries():
            fixed = ", ".join(f"{k}={v}" for k, v in entry.fixed.items())
            on_cpu = f" -> CPU kernel: {kernels[entry.name]}" if registry is WEIGHT_FORMATS and entry.name in kernels else ""
            print(f"  {entry.name:<10} {entry.summary}" + (f" [{fixed}]" if fixed else "") + on_cpu)
    print("matmul kernels (kernel: auto tries them in this order):")
    for path, cls in KERNELS.items():
        first = (cls.__doc__ or "").strip().split(". ")[0].splitlines()[0].rstrip(".")
        print(f"  {path:<18} {first}" + ("" if cls.in_auto(_cpu()) else " (on CPU only when named)"))
    return 0


def _cpu_kernels(registry) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The matmul path ``kernel: auto`` gives each weight format's example on CPU with bf16 activations (a 128x256
    linear); calibrated formats store what their bits and groups say (the same paths), files-based ones are skipped."""
    import torch
    from torch import nn

    from .quant import quantize_

    found = {}
    for entry in registry.entries():
        cls = entry.cls
        if cls.example_fields is None or cls.requires_calibration or cls.slow_to_apply:
            found[entry.name] = "— (calibrated or file-based: the path of its stored form)"
            continue
        try:
            fmt = entry.example(**({"kernel": "auto"} if "kernel" in cls.model_fields else {}))
            model = nn.Sequential(nn.Linear(256, 128, bias=False)).to(torch.bfloat16)
            quantize_(model, fmt)
            found[entry.name] = ",".join(sorted({m.kernel_path for m in model.modules() if hasattr(m, "kernel_path")}))
            found[entry.name] = found[entry.name] or "dense"
        except Exception as e:  # noqa: BLE001 - listed, not raised: the listing is informational
            found[entry.name] = f"— ({type(e).__name__})"
    return found


def _cpu():  # type: ignore[no-untyped-def]
    import torch

    return torch.device("cpu")


DEFAULT_WEIGHT_FORMATS = ["fp32", "bf16", "int8", "int4:group_size=128", "int3:group_size=128"]
DEFAULT_KV_FORMATS = ["native", "fp8", "int8", "int4"]


def parse_format_spec(spec: str) -> dict[str, object]:
    """``int4:group_size=128,symmetric=true`` -> ``{"format": "int4", "group_size": 128, "symmetric": True}``."""
    import yaml

    name, _, fields = spec.partition(":")
    entry: dict[str, object] = {"format": name}
    for item in filter(None, fields.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise QuantlabError(f"format {spec!r}: expected field=value after ':', got {item!r}")
        entry[key.strip()] = yaml.safe_load(value)
    return entry


def _estimate(args: argparse.Namespace) -> int:
    import json

    from .estimate import estimate, render_estimate
    from .kv import KV_FORMATS
    from .quant import WEIGHT_FORMATS
    from .run.recipe import resolve_format

    weights = [resolve_format(WEIGHT_FORMATS, parse_format_spec(s), "--weight-format", s) for s in args.weight_format]
    kv = [resolve_format(KV_FORMATS, parse_format_spec(s), "--kv-format", s) for s in args.kv_format]
    if (args.seq_len is not None and args.seq_len <= 0) or args.batch <= 0:
        raise QuantlabError("--seq-len and --batch must be positive integers")
    est = estimate(args.config, weights, kv, args.seq_len, args.batch, args.dtype)
    fits = []
    if args.gpu_memory:
        from .dtypes import DTYPES
        from .estimate.fit import fit_dicts, parse_bytes, plan, render_fit

        device_bytes = parse_bytes(args.gpu_memory)
        if args.gpus <= 0 or not 0 <= args.reserve < 1:
            raise QuantlabError("--gpus must be positive and --reserve between 0 and 1")
        fits = plan(est, kv, device_bytes, args.gpus, DTYPES[est.dtype], args.reserve)
    if args.json:
        print(json.dumps({**est.to_dict(), **({"fit": fit_dicts(fits)} if args.gpu_memory else {})}, indent=2))
    else:
        extra = render_fit(fits, device_bytes, args.gpus, est, args.reserve) if fits else None
        print(render_estimate(est, extra), end="")
    if est.architecture.not_interpreted:
        print(f"quantlab: warning: {args.config}: not interpreted (estimated without them): "
              + "; ".join(est.architecture.not_interpreted), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantlab",
        description="Compare weight and KV-cache formats of a causal LM: memory, decode latency, perplexity.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a recipe and write its report",
                         description="Apply each variant of a recipe, measure it, and write results and a report. "
                         "Variants already finished in the output folder are skipped (resume); other runs into the "
                         "same folder share the work.", epilog=EXIT_CODES)
    run.add_argument("recipe", help="recipe YAML file")
    run.add_argument("--out", type=Path, default=None, help="output folder (default: reports/<recipe name>)")
    run.add_argument("--executor", default=None, metavar="KIND",
                     help="where variants run: a registered executor (quantlab formats lists them: here one at a time, "
                     "or as Ray tasks); default: the recipe's executor, local")
    run.add_argument("--address", default=None, help="with --executor ray: the Ray cluster to join (auto, ray://..., "
                     "host:port); without it a local Ray instance is started")
    run.add_argument("--threads", type=int, default=None, metavar="N",
                     help="CPU threads torch uses while measuring (default: the recipe's threads, else one per core)")
    run.add_argument("--shard", metavar="I/N", default=None,
                     help="measure only shard I of N (0 <= I < N) of the variants, by a stable hash of each variant's "
                     "config: N array jobs into one shared --out cover every variant once")
    run.add_argument("--retime", nargs="?", const="noisy", choices=("noisy", "all"), default=None,  # run.sweep.Retime
                     help="measure again the decode timing of the variants measured before (their quality figures "
                     "and exports are kept, also where another machine measured them): those whose timing was flagged noisy (--retime, or --retime noisy; run "
                     "it on a quiet machine), or all of them (--retime all: after the engine or its kernels changed)")
    run.add_argument("--rounds", type=int, default=1, metavar="N",
                     help="with --retime: hold the variants to time again together in this process and time them in "
                     "N rounds, each variant in turn (rotating order), their steps pooled: a machine that drifts "
                     "slows every variant alike (default 1: each alone, one after another)")
    run.add_argument("--add", action="store_true",
                     help="add this recipe's variants to an output folder that holds another recipe's records "
                     "(without it such a folder is refused)")
    run.set_defaults(func=_run)
    report = sub.add_parser("report", help="rebuild the views (reports, tables, results.jsonl) from records/",
                            description="Rebuild the report and tables of a finished or interrupted run from its "
                            "records/ (a folder written before records is read from its results.jsonl).")
    report.add_argument("dir", help="a run's output folder")
    report.add_argument("--summary", action="store_true",
                        help="print the answer (as quantlab run ends) instead of the report's path")
    report.add_argument("--paired", nargs=2, metavar=("A", "B"),
                        help="print whether variants A and B differ in mean KL and in their log-likelihood's exp (a "
                        "paired bootstrap over the windows both scored, 95%%) instead of rebuilding the views")
    report.set_defaults(func=_report)
    compare = sub.add_parser("compare", help="one report across runs, variants aligned by label",
                             description="Build compare.md, compare.html and compare.csv from two or more result "
                             "folders (e.g. one recipe on two machines, or two recipes sharing a baseline); later runs "
                             "are also given as ratios to the first.")
    compare.add_argument("dirs", nargs="+", help="result folders of finished or interrupted runs")
    compare.add_argument("--out", type=Path, default=Path("reports") / "compare", help="output folder (default: reports/compare)")
    compare.set_defaults(func=_compare)
    est = sub.add_parser("estimate", help="evidence table and memory worksheet from a model's config (no weights)",
                         description="Read a config.json (or a model folder, or a hub id where the hub is reachable): "
                         "which facts the file states, which the transformers implementation decides, parameters by "
                         "component, weight payload per weight format and KV cache per KV format. "
                         "Formats are names with optional fields, e.g. int4:group_size=64,symmetric=true.")
    est.add_argument("config", help="config.json, model folder or hub id")
    est.add_argument("--seq-len", type=int, default=None, help="stored positions per sequence (default: the position limit)")
    est.add_argument("--batch", type=int, default=1, help="independent sequences (default 1)")
    est.add_argument("--weight-format", nargs="+", default=DEFAULT_WEIGHT_FORMATS, metavar="F",
                     help=f"weight formats (default: {' '.join(DEFAULT_WEIGHT_FORMATS)})")
    est.add_argument("--kv-format", nargs="+", default=DEFAULT_KV_FORMATS, metavar="F",
                     help=f"KV-cache formats (default: {' '.join(DEFAULT_KV_FORMATS)})")
    est.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                     help="dtype of unquantized tensors and of native KV caches (default: the file's torch_dtype)")
    est.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    est.add_argument("--gpu-memory", default=None, metavar="SIZE",
                     help="plan the fit on devices of this size (80GiB, 80GB, ...): devices needed per format pair, "
                     "largest batch and context on --gpus of them")
    est.add_argument("--gpus", type=int, default=1, help="with --gpu-memory: how many devices (default 1)")
    est.add_argument("--reserve", type=float, default=0.10,
                     help="with --gpu-memory: share of each device kept for the CUDA context, fragmentation and "
                     "decode activations (default 0.10)")
    est.set_defaults(func=_estimate)
    sens = sub.add_parser("sensitivity", help="quantize one group of modules at a time and rank them by divergence",
                          description="Put one group of linears (a decoder layer, a module type, or one module) in "
                          "a format, keep the rest as the recipe's baseline, and measure the KL divergence from "
                          "the baseline on windows of the recipe's calibration text. Writes sensitivity.md/.csv "
                          "(ranked; the csv can be a mixed format's sensitivity_path) and sensitivity.svg (layers x "
                          "module types) into the output folder; an interrupted sweep resumes.", epilog=EXIT_CODES)
    sens.add_argument("recipe", help="recipe YAML file (its model, baseline and calibration text)")
    sens.add_argument("--format", action="append", default=None, metavar="F",
                      help="weight format, e.g. int3:group_size=128; repeat for several (default: the recipe's first "
                      "weight format that is not the baseline)")
    sens.add_argument("--granularity", choices=["layer", "module-type", "module"], default="layer")
    sens.add_argument("--max-tokens", type=int, default=2048, help="calibration tokens scored (default 2048)")
    sens.add_argument("--out", type=Path, default=None,
                      help="output folder (default: reports/<recipe>-sensitivity-<formats>-<granularity>)")
    sens.set_defaults(func=_sensitivity)
    plan = sub.add_parser("plan", help="choose weight and KV formats per layer together within a memory budget",
                          description="Measure the divergence of each decoder layer's linears in each of the recipe's "
                          "weight formats (the sensitivity scan) and of each layer's KV cache in each of its KV formats "
                          "(through the cache), then choose one option per layer for the least summed divergence whose "
                          "memory at the workload fits --memory (an exact knapsack over weights and cache together). "
                          "Writes plan.md, plan.json and plan-recipe.yaml (the plan beside the baseline, for quantlab "
                          "run).", epilog=EXIT_CODES)
    plan.add_argument("recipe", help="recipe YAML file (its model, baseline, weight and KV formats, texts)")
    plan.add_argument("--memory", default=None, help="the budget: 24GiB, 500MB or a byte count (default: the "
                      "recipe's plan.memory_bytes)")
    plan.add_argument("--context", type=int, default=None, help="positions held per sequence at the workload "
                      "(default: the recipe's plan.context_tokens)")
    plan.add_argument("--batch", type=int, default=None, help="sequences held at once (default: the recipe's "
                      "plan.batch_size, else 1)")
    plan.add_argument("--kv-group-layers", type=int, default=None,
                      help="consecutive layers of one attention kind that share a KV format (default: the recipe's "
                      "plan.kv_group_layers, else 1)")
    plan.add_argument("--no-measure", action="store_true", help="skip applying the plan and the uniform "
                      "configurations that fit whole to measure them (the recipe's plan.measure)")
    plan.add_argument("--out", type=Path, default=None, help="output folder (default: reports/<recipe>-plan)")
    plan.set_defaults(func=_plan)
    export = sub.add_parser("export", help="write a measured variant as GGUF, a GPTQ folder, ... for another engine",
                            description="Quantize the run's variant again as its recipe says, check that the numbers "
                            "are the ones measured (the record's weights digest), and write them in the target format with quantlab-export.json "
                            "(each tensor's type and its deviation from the measured weights). Nothing is re-rounded: "
                            "a module the target cannot hold is refused, naming the format that would export.",
                            epilog=EXIT_CODES)
    export.add_argument("dir", help="a run's output folder")
    export.add_argument("--variant", required=True, help="variant label, or weight-format label (e.g. int4-g32-sym)")
    export.add_argument("--to", required=True, help="a registered export target (quantlab formats lists them: GGUF for "
                        "llama.cpp, compressed-tensors for vLLM, GPTQ and AWQ folders)")
    export.add_argument("--out", type=Path, required=True, help="folder to write")
    export.set_defaults(func=_export)
    init = sub.add_parser("init", help="write a starter recipe, or a shipped example recipe, to start from",
                          description="Write a commented starter recipe NAME.yaml (default my-recipe.yaml) into the "
                          "current folder, or with --example one of the recipes shipped with quantlab (--list names "
                          "them), with any lm-eval task folder it names.")
    init.add_argument("name", nargs="?", default=None, help="recipe name: the file NAME.yaml and its run folder")
    init.add_argument("--example", default=None, metavar="NAME", help="a shipped recipe (quickstart, smollm2-135m, "
                      "gemma3-270m, ...; --list shows every one)")
    init.add_argument("--list", action="store_true", help="list the shipped example recipes")
    init.add_argument("--dir", default=".", help="folder to write into (default: the current one)")
    init.add_argument("--force", action="store_true", help="replace an existing file of the same name")
    init.set_defaults(func=_init)
    formats = sub.add_parser("formats", help="list the registered formats, protocols, executors and kernels",
                             description="List every registered weight and KV-cache format, perplexity protocol, "
                             "executor and matmul kernel with one line each.")
    formats.add_argument("--kernels", action="store_true",
                         help="also quantize each weight format's example on CPU and show the matmul kernel it gets")
    formats.set_defaults(func=_formats)
    return parser


# Notices other packages log while being imported, that are not quantlab's output: torchao's optional CUDA
# extensions it cannot load on this machine, torch's pytree deprecation notes that torchao's import triggers.
EXIT_CODES = "exit status: 0 every variant measured; 1 some variant failed (results and report written); " \
    "2 bad input (nothing measured); 130 interrupted (run the same command again to resume)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_import_noise()
    try:
        return args.func(args)
    except QuantlabError as e:
        print(f"quantlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quantlab: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def entry() -> None:
    """The ``quantlab`` command. A bad input (exit 2) leaves without the interpreter's teardown of torch, about
    0.4 s of a 2 s error path on 2 cores; every file quantlab writes is closed by then. Where Ray was started,
    its exit handlers run as usual."""
    code = main()
    if code == 2 and "ray" not in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
