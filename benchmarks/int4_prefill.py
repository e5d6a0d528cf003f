"""int4 weights on torch's CPU kernel: inputs of many rows through the weights read back from its packing and the
dense bf16 matmul, against torch's fused kernel for every row count.

    python benchmarks/int4_prefill.py [--model smollm2|gemma3] [--variant int4-g32] [--tokens 128 512] [--rounds 5]

First one linear of each shape the model holds, at 1 to 512 rows: ``torch._weight_int4pack_mm_for_cpu`` against
``Int4CPUKernel``'s read-back (``quant/forms/affine/int4pack.py``) and matmul, best of 5 timings of 20 calls each.
Then whole prefills (``Generation.prefill``: the forward and the last position's head, the compiled engine with the
native cache) of the model stored as the variant, with the read-back and with every weight left on torch's kernel
(``layout = None``), alternating round by round in one process: the median prefill of each and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import vs_llamacpp as bench

from quantlab import quantize_
from quantlab.engine.torch.decode import DecodeEngine
from quantlab.models import ModelSpec, load_model
from quantlab.quant.format import build_format
from quantlab.quant.forms.affine.torch_int import Int4CPUKernel


def _best_ms(f, calls: int = 20) -> float:
    f()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    return best


def linears(kernels: list[Int4CPUKernel], rows: list[int]) -> None:
    shapes = {}
    for k in kernels:
        shapes.setdefault(tuple(k.shape), k)
    print("| weight (out x in) | rows | torch's kernel ms | read-back + matmul ms | ratio |\n|---|---:|---:|---:|---:|")
    for (out, n_in), k in shapes.items():
        for m in rows:
            x = torch.randn(m, n_in).to(torch.bfloat16)
            layout, fused = k.layout, k.max_fused_rows
            try:
                k.layout = None
                torch_ms = _best_ms(lambda: k(x))
                k.layout, k.max_fused_rows = layout, 0
                own_ms = _best_ms(lambda: k(x))
            finally:
                k.layout, k.max_fused_rows = layout, fused
            print(f"| {out} x {n_in} | {m} | {torch_ms:.3f} | {own_ms:.3f} | {own_ms / torch_ms:.2f} |", flush=True)


def prefills(m: torch.nn.Module, kernels: list[Int4CPUKernel], tokens: list[int], rounds: int) -> None:
    layouts = [k.layout for k in kernels]
    for n in tokens:
        with DecodeEngine(m, bench._kv_format("native"), torch.device("cpu"), "compiled", n + 16) as engine:
            prompt = torch.randint(0, m.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
            engine.warm_up(prompt[:, :64], 2)
            times: dict[str, list[float]] = {"read-back": [], "torch": []}
            try:
                for _ in range(rounds):
                    for side in times:
                        for k, layout in zip(kernels, layouts):
                            k.layout = layout if side == "read-back" else None
                        engine.generation().prefill(prompt)
                        times[side].append(engine.generation().prefill(prompt))
            finally:
                for k, layout in zip(kernels, layouts):
                    k.layout = layout
        median = {side: statistics.median(ts) for side, ts in times.items()}
        print(f"{n:>6} tokens: read-back {median['read-back']:9.1f} ms, torch's kernel {median['torch']:9.1f} ms, "
              f"ratio {median['read-back'] / median['torch']:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(bench.MODELS), default="smollm2")
    p.add_argument("--variant", default="int4-g32", choices=["int4-g32", "int4-g32-fz"])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 128, 512])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    model = bench.MODELS[args.model]
    m = load_model(ModelSpec(package=model.package, gguf_file=model.gguf, dtype="bfloat16")).model
    quantize_(m, build_format(bench.VARIANTS[args.variant]))
    kernels = [k for k in m.modules() if isinstance(k, Int4CPUKernel)]
    print(f"{args.model} {args.variant}: {len(kernels)} weights on torch's int4 kernel, layout "
          f"{kernels[0].layout if kernels else None}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    linears(kernels, args.rows)
    prefills(m, kernels, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
