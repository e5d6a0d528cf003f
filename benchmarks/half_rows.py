"""One row of activations times a dense bf16 (or fp16) weight: the C kernel against what it replaces and the
weight's bytes' bound.

    python benchmarks/half_rows.py [--shapes 576x49152 576x1536 1536x576 4096x4096] [--dtype bfloat16]
        [--layers 8] [--rounds 3]

For each shape (in x out) it times ``quantlab::half_rows_matmul`` (``quant/kernels/half_rows.py``, the compiled
engine's one-row product for a 16-bit linear where the CPU has AVX-512), the engine's former path (the
float32 multiply-and-sum that inductor compiles into one loop, ``kernels.base.fused_row_matmul``) and
``aten::linear``. ``--layers N`` keeps N copies of each weight and calls them in turn, as a decode step visits its
layers, so that the weights come from memory rather than the last-level cache. Each figure: the median of the
calls after warm-up, best of ``--rounds`` rounds interleaved path by path. Prints µs a call, the weight's GB/s and
the ratio to the bytes' bound (weight bytes / the copy bandwidth measured first).
"""
from __future__ import annotations

import argparse

import torch
from linear_kernels import median_us

from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.quant.kernels import half_rows
from quantlab.quant.kernels.base import fused_row_matmul

CPU = torch.device("cpu")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["576x49152", "576x1536", "1536x576", "4096x4096"],
                   help="in x out; the first is SmolLM2-135M's output head, the next two its MLP projections")
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not half_rows.available():
        raise SystemExit("the half_rows kernel has no vectorized path on this CPU (it needs AVX-512)")
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth_bytes_per_s(CPU)
    path = {2: "vdpbf16ps", 1: "AVX-512 FMA"}[half_rows.library().half_rows_path()] if dtype == torch.bfloat16 \
        else "AVX-512 FMA"
    print(f"{torch.get_num_threads()} thread(s), {args.dtype}, kernel path {path}, copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s, {args.layers} weight(s) in turn; median of {args.repeats}, best of "
          f"{args.rounds} rounds\n")
    print("| shape (in x out) | path | µs | GB/s | × bytes' bound |")
    print("|---|---|---:|---:|---:|")
    loop = torch.compile(fused_row_matmul, dynamic=False)
    for shape in args.shapes:
        n_in, out = (int(v) for v in shape.split("x"))
        weights = [torch.randn(out, n_in).to(dtype) for _ in range(args.layers)]
        x = torch.randn(1, n_in).to(dtype)
        turn = iter(range(1 << 62))
        paths = {"half_rows (C)": lambda w: half_rows.matmul_op(x, w),
                 "fused_row_matmul (inductor)": lambda w: loop(x, w),
                 "aten::linear": lambda w: torch.nn.functional.linear(x, w)}
        best = {name: float("inf") for name in paths}
        for _ in range(args.rounds):
            for name, fn in paths.items():
                best[name] = min(best[name], median_us(lambda: fn(weights[next(turn) % args.layers]), CPU, args.repeats))
        nbytes = weights[0].numel() * weights[0].element_size()
        bound_us = 1e6 * nbytes / bandwidth
        for name, us in best.items():
            print(f"| {shape} | {name} | {us:.1f} | {nbytes / us / 1e3:.1f} | {us / bound_us:.2f} |")


if __name__ == "__main__":
    main()
