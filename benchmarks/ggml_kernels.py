"""One decode row through each ggml block kernel: llama.cpp's repacked layout (``ggml_repack_cpu``: Q4_0, IQ4_NL,
Q4_K, eight rows interleaved) against the row-at-a-time dot products (``ggml_q8_cpu``), and both against the
bytes' bound (the weight's bytes at the machine's measured copy bandwidth).

    python benchmarks/ggml_kernels.py [--threads 1] [--shapes 576x1536 1536x576 2048x2048] [--repeats 200]

Each kernel's product (the activations rounded to 8-bit blocks, then the integer products) is timed as the plain
function a compiled graph's op calls, after warm-up, as the median of ``--repeats`` calls, rounds interleaved
kernel by kernel. Prints a Markdown table: µs per product, GB/s of weight bytes, the share of the copy bandwidth,
and repacked / row-at-a-time. Random weights (the product's speed does not depend on their values).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.quant.forms.ggml.kernel import (
    GGMLQ8CPUKernel,
    GGMLRepackCPUKernel,
    dot_products_available,
    quantize_ggml,
    repack_available,
)
from quantlab.quant.forms.ggml.tensor import GGML_TYPES

TYPES = ("Q4_0", "IQ4_NL", "Q4_K", "Q5_0", "Q6_K", "Q8_0")


def _median_us(fn, x: torch.Tensor, repeats: int) -> float:
    for _ in range(10):
        fn(x)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--shapes", nargs="+", default=["576x1536", "1536x576", "2048x2048", "2048x8192"],
                    help="in x out")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not dot_products_available():
        print("ggml's integer products need AVX2, FMA and F16C; this CPU lacks one of them")
        return
    torch.set_num_threads(args.threads)
    gbs = copy_bandwidth_bytes_per_s(torch.device("cpu")) / 1e9
    print(f"{time.strftime('%Y-%m-%d')}: torch {torch.__version__}, {args.threads} threads, copy bandwidth "
          f"{gbs:.1f} GB/s; one row, the median of {args.repeats} calls, best of {args.rounds} interleaved rounds")
    print("\n| type | in x out | MB | row-at-a-time µs | GB/s | repacked µs | GB/s | share of copy bw | repacked / row |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in TYPES:
        block = GGML_TYPES[kind].block
        for shape in args.shapes:
            n_in, out = (int(v) for v in shape.split("x"))
            if n_in % block:
                continue
            q = quantize_ggml(torch.randn(out, n_in) * 0.05, kind)
            x = torch.randn(1, n_in)
            kernels = {"row": GGMLQ8CPUKernel(q, torch.float32)}
            if GGMLRepackCPUKernel.supports(q, torch.device("cpu"), torch.float32):
                kernels["repacked"] = GGMLRepackCPUKernel(q, torch.float32)
            best: dict[str, float] = {}
            for _ in range(args.rounds):
                for name, k in kernels.items():
                    best[name] = min(best.get(name, float("inf")), _median_us(k.fused, x, args.repeats))
            mb = q.blocks.numel() / 1e6
            row = best["row"]
            rep = best.get("repacked")
            cells = [kind, shape, f"{mb:.2f}", f"{row:.1f}", f"{mb / row * 1e3:.1f}"]
            if rep is None:
                cells += ["—", "—", f"{mb / row * 1e3 / gbs:.0%}", "—"]
            else:
                cells += [f"{rep:.1f}", f"{mb / rep * 1e3:.1f}", f"{mb / rep * 1e3 / gbs:.0%}", f"{rep / row:.2f}"]
            print("| " + " | ".join(cells) + " |")
    print(f"\nrepacked layouts on this CPU: {', '.join(t for t in TYPES if repack_available(t)) or 'none'}")


if __name__ == "__main__":
    main()
