"""One layer's decode attention over a stored cache: the C kernels that read the codes (``native/kv_attention.c``:
the scores against the keys, the weighted sum of the values) for each stored layout, against the native cache's
two products (torch's bf16 matmuls over the same positions) and the bytes' bound.

    python benchmarks/kv_kernels.py [--threads 1] [--positions 4096] [--heads 3] [--group 3] [--head-dim 64]
        [--layers 30]

The stores hold random codes (the kernels' speed does not depend on their values) for ``--heads`` key/value heads
of ``--positions`` positions, each read by ``--group`` query rows (SmolLM2-135M: 3 KV heads, 3 query heads each,
64 channels). Each figure is the median of ``--repeats`` calls of scores + values after warm-up, best of
``--rounds`` rounds interleaved layout by layout. Prints a Markdown table: µs per layer, the stored MB, GB/s of
those bytes, and the ratio to the bf16 products. ``--layers N`` keeps N copies of every store and calls them in
turn, as a decode step visits its layers: with SmolLM2's 30 layers at 4,096 positions the stores no longer fit
in the last-level cache and are read from memory, as they are in a step (one layer's store, the default, stays
in cache between calls).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import torch

from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.kv import code_attention as ca

INT = {"int8": 8, "int4": 4, "int2": 2}


def _int_store(bits: int, bh: int, s: int, d: int, group: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(bits)
    groups = d // group
    return {"data": torch.randint(0, 256, (bh, s, d * bits // 8), dtype=torch.uint8, generator=g),
            "scales": (torch.rand(bh, s, groups, generator=g) * 0.02 + 0.01).half(),
            "zeros": torch.randint(0, 256, (bh, s, max(1, groups * bits // 8)), dtype=torch.uint8, generator=g)}


def layouts(bh: int, s: int, d: int, group_size: int) -> dict[str, tuple[int, int, int, dict[str, torch.Tensor]]]:
    """name -> (kind, bits, group, tensors)."""
    out = {name: (ca.INT, bits, group_size, _int_store(bits, bh, s, d, group_size)) for name, bits in INT.items()}
    g = torch.Generator().manual_seed(0)
    e4m3 = torch.randint(0, 126, (bh, s, d), dtype=torch.uint8, generator=g)
    out["fp8"] = (ca.CAST_E4M3, 0, d, {"data": e4m3, "scales": torch.rand(bh, s, 1, generator=g).half(), "zeros": None})
    out["bf16 (cast)"] = (ca.CAST_BF16, 0, d, {"data": torch.randn(bh, s, d, generator=g).bfloat16(),
                                               "scales": None, "zeros": None})
    q80 = torch.randint(0, 256, (bh, s, d), dtype=torch.uint8, generator=g)
    out["q8_0"] = (ca.BLOCK_KINDS["q8_0"], 0, 32, {"data": q80, "scales": torch.rand(bh, s, d // 32, generator=g).half(),
                                                   "zeros": None})
    q40 = torch.randint(0, 256, (bh, s, d // 2), dtype=torch.uint8, generator=g)
    out["q4_0"] = (ca.BLOCK_KINDS["q4_0"], 0, 32, {"data": q40, "scales": torch.rand(bh, s, d // 32, generator=g).half(),
                                                   "zeros": None})
    return out


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--positions", type=int, default=4096)
    p.add_argument("--heads", type=int, default=3, help="key/value heads")
    p.add_argument("--group", type=int, default=3, help="query rows per key/value head")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--group-size", type=int, default=64, help="channels per scale of the integer layouts")
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layers", type=int, default=1, help="copies of each store called in turn (a step's layers)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    bh, s, d, gq = args.heads, args.positions, args.head_dim, args.group
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(bh, gq, d, generator=gen)
    probs = torch.softmax(torch.randn(bh, gq, s, generator=gen), -1)
    n = torch.tensor(s, dtype=torch.int64)
    caches = [(torch.randn(bh, s, d, generator=gen).bfloat16(), torch.randn(bh, s, d, generator=gen).bfloat16())
              for _ in range(args.layers)]
    native_turns = itertools.cycle(caches)

    def native() -> None:  # the native cache's step: q K^T and p V in bf16, as the engine runs them
        keys, values = next(native_turns)
        torch.matmul(q.bfloat16(), keys.transpose(1, 2))
        torch.matmul(probs.bfloat16(), values)

    calls: dict[str, tuple[Callable[[], object], int]] = {"native bf16 (matmul)": (native, 2 * caches[0][0].nbytes)}
    for name, (kind, bits, group, t) in layouts(bh, s, d, args.group_size).items():
        t = {**t, "data": t["data"].unsqueeze(0)}  # the stores are [batch, heads, slots, ·]
        stored = sum(x.nbytes for x in t.values() if x is not None)
        turns = itertools.cycle([{k: (x.clone() if x is not None else None) for k, x in t.items()}
                                 for _ in range(args.layers)])

        def kernel(kind=kind, bits=bits, group=group, turns=turns) -> None:
            t = next(turns)
            ca.kv_scores(kind, bits, group, d, t["data"], t["scales"], t["zeros"], n, q)
            ca.kv_values(kind, bits, group, d, t["data"], t["scales"], t["zeros"], n, probs)

        calls[name] = (kernel, 2 * stored)
    best = {name: float("inf") for name in calls}
    for _ in range(args.rounds):
        for name, (fn, _) in calls.items():
            best[name] = min(best[name], _median_us(fn, args.repeats))
    bandwidth = copy_bandwidth_bytes_per_s(torch.device("cpu"))
    base = best["native bf16 (matmul)"]
    print(f"{args.threads} thread(s), {args.layers} layer(s) in turn, {bh} KV heads x {gq} query rows x {s} "
          f"positions x {d} channels, integer groups of {args.group_size}; copy bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"median of {args.repeats}, best of {args.rounds} rounds\n")
    print("| layout | µs (scores + values) | MB stored (K + V) | GB/s | bytes' bound µs | × native bf16 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (_, nbytes) in calls.items():
        us = best[name]
        print(f"| {name} | {us:.1f} | {nbytes / 1e6:.2f} | {nbytes / us / 1e3:.1f} | {nbytes / bandwidth * 1e6:.1f} | "
              f"{us / base:.2f} |")


if __name__ == "__main__":
    main()
