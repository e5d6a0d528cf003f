"""One decode row through the CPU kernel ``auto`` picks for each weight format, against the kernel its target
compares it with (every 4-bit format against int4 in groups of 32, FP8 against int8, int3 and int2 against int4),
and against the bytes' bound (the weight's bytes at the machine's measured copy bandwidth).

    python benchmarks/format_kernels.py [--threads 1] [--shapes 2048x2048 576x1536 1536x576] [--repeats 200]

Each format quantizes one bf16 ``nn.Linear`` (random weights; the product's speed does not depend on their
values) and its forward is timed on one bf16 row as a model calls it (the activation's conversion included),
after warm-up, as the median of ``--repeats`` calls, best of ``--rounds`` rounds interleaved format by format.
Prints a Markdown table: µs per product, GB/s of the weight's bytes, the share of the copy bandwidth, the ratio to
the format's comparison, and the kernel.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from quantlab import quantize_
from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.extend import WEIGHT_FORMATS

FORMATS = {  # name -> (format fields, the format it is compared with)
    "int4-g32": ({"format": "int4", "group_size": 32}, None),
    "int8": ({"format": "int8"}, None),
    "nf4": ({"format": "nf4"}, "int4-g32"),
    "fp4": ({"format": "fp4"}, "int4-g32"),
    "hqq4-g64": ({"format": "hqq", "bits": 4, "group_size": 64}, "int4-g32"),
    "mxfp4": ({"format": "mxfp4"}, "int4-g32"),
    "nvfp4": ({"format": "nvfp4"}, "int4-g32"),
    "fp8": ({"format": "fp8"}, "int8"),
    "mxfp8": ({"format": "mxfp8"}, "int8"),
    "int3-g128": ({"format": "int3", "group_size": 128}, "int4-g32"),
    "int2-g64": ({"format": "int2", "group_size": 64}, "int4-g32"),
}


class _One(nn.Module):
    def __init__(self, n_in: int, out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(n_in, out, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _median_us(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    for _ in range(20):
        module(x)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        module(x)
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--shapes", nargs="+", default=["2048x2048", "576x1536", "1536x576"], help="in x out")
    ap.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gbs = copy_bandwidth_bytes_per_s(torch.device("cpu")) / 1e9
    names = list(dict.fromkeys([*(FORMATS[f][1] for f in args.formats if FORMATS[f][1]), *args.formats]))
    print(f"{time.strftime('%Y-%m-%d')}: torch {torch.__version__}, {args.threads} threads, copy bandwidth "
          f"{gbs:.1f} GB/s; one bf16 row, the median of {args.repeats} calls, best of {args.rounds} interleaved rounds")
    print("\n| format | in x out | kernel | MB | µs | GB/s | share of copy bw | against | ratio |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|")
    for shape in args.shapes:
        n_in, out = (int(v) for v in shape.split("x"))
        modules = {}
        for name in names:
            m = _One(n_in, out)
            quantize_(m, WEIGHT_FORMATS.build_entry({**FORMATS[name][0], "compute_dtype": "bfloat16"}))
            modules[name] = m
        x = torch.randn(1, n_in, dtype=torch.bfloat16)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, m in modules.items():
                best[name] = min(best.get(name, float("inf")), _median_us(m, x, args.repeats))
        for name in names:
            kernel = modules[name].proj.kernel
            mb = sum(b.numel() * b.element_size() for b in kernel.buffers()) / 1e6
            against = FORMATS[name][1]
            ratio = f"{best[name] / best[against]:.2f}" if against in best else "—"
            print(f"| {name} | {shape} | {kernel.path} | {mb:.2f} | {best[name]:.1f} | {mb / best[name] * 1e3:.1f} | "
                  f"{mb / best[name] * 1e3 / gbs:.0%} | {against or '—'} | {ratio} |")


if __name__ == "__main__":
    main()
