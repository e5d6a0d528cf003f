"""What one call of a C kernel costs beyond its work, by how the op is defined: the plain Python function, the op as
``torch.library.custom_op`` defines it, as ``quantlab.native.ops.native_op`` defines it (the dispatcher directly,
a Python kernel), and quantlab's own op with its C++ kernel (``native.load_ops``: no Python in the call), each
called as a compiled graph calls it and inside a compiled chain of 50 calls.

    python benchmarks/op_overhead.py [--threads 1] [--calls 3000]

The kernel is ggml's Q4_K product over a small weight (64 x 256), so its work is a few microseconds and the rest is
overhead. Prints microseconds per call and each definition's ratio to the plain function.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from quantlab import native
from quantlab.native.ops import native_op, register_fake
from quantlab.quant.forms.ggml.kernel import GGML_TYPES, ggml_matmul_q8, matmul_q8_op, quantize_ggml


def per_call_us(f: Callable[[], object], calls: int) -> float:
    for _ in range(calls // 10):
        f()
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    small, square = quantize_ggml(torch.randn(64, 256), "Q4_K"), quantize_ggml(torch.randn(256, 256), "Q4_K")
    x = torch.randn(1, 256)

    wrapped = torch.library.custom_op("quantlab_bench::wrapped", ggml_matmul_q8, mutates_args=())
    wrapped.register_fake(lambda x, blocks, ggml_type: x.new_empty(x.shape[0], blocks.shape[0]))
    direct = native_op("bench_direct", ggml_matmul_q8)
    register_fake(direct)(lambda x, blocks, ggml_type: x.new_empty(x.shape[0], blocks.shape[0]))
    ops = {"plain function": ggml_matmul_q8, "custom_op": torch.ops.quantlab_bench.wrapped.default,
           "native_op": direct}
    if native.load_ops("ggml"):
        ops["native_op + C++ kernel"] = matmul_q8_op
    q4_k = GGML_TYPES["Q4_K"].ggml_id

    print("| definition | us per call | x plain | us per call in a compiled chain of 50 | x plain |\n|---|---|---|---|---|")
    base: dict[str, float] = {}
    for name, op in ops.items():
        alone = per_call_us(lambda: op(x, small.blocks, q4_k), args.calls)

        def chain(h: torch.Tensor, op=op) -> torch.Tensor:
            for _ in range(50):
                h = torch.tanh(h + op(h, square.blocks, q4_k))
            return h

        with torch.inference_mode():
            run = chain if name == "plain function" else torch.compile(chain, fullgraph=True)
            chained = per_call_us(lambda: run(x), max(1, args.calls // 50)) / 50
        base.setdefault("alone", alone)
        base.setdefault("chained", chained)
        print(f"| {name} | {alone:.2f} | {alone / base['alone']:.2f} | {chained:.2f} | {chained / base['chained']:.2f} |")


if __name__ == "__main__":
    main()
