"""Time each quantized matmul path against the dense matmul it replaces.

    python benchmarks/linear_kernels.py [--shapes 4096x4096 4096x14336 576x1536 1536x576] [--batches 1 16] [--device cpu] [--compile]

For each shape (in x out), batch and path it prints the median time of a
forward (after warm-up, device synchronized) and its ratio to the fp32 and
bf16 dense matmuls of the same shape (speed-up > 1 is faster). ``--compile``
times every forward, the dense ones included, through torch.compile with the
compiled decode engine's options (on CUDA: CUDA graphs and gpt-fast's inductor
flags), where casts and unpacking can fuse into the matmul; on CPU a single row
then takes the engine's fused one-row matmul (dense bf16 and int8 per channel).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Callable

import torch
from torch import nn

from quantlab import UnsupportedError, quantize_tensor
from quantlab.engine.device import resolve_device, timed_ms
from quantlab.engine.torch.compiled import compiled_step, fused_row_linears
from quantlab.quant.kernels.base import KERNELS, Kernel, choose_kernel

CASES = [("int8-pc", 8, None), ("int4-g128", 4, 128), ("int4-g32", 4, 32), ("int3-g128", 3, 128), ("int2-g64", 2, 64)]


def median_us(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    """Median of ``repeats`` timed calls after 3 warm-up ones (CUDA events on GPU)."""
    for _ in range(3):
        fn()
    return 1e3 * statistics.median(timed_ms(fn, device)[1] for _ in range(repeats))


def kernels_for(w: torch.Tensor, device: torch.device, shape: str) -> list[tuple[str, Kernel]]:
    """Each case's weight stored for every path that takes it with bf16 activations."""
    built = []
    for name, bits, group in CASES:
        q = quantize_tensor(w, bits, group)
        for path, cls in KERNELS.items():
            if not (isinstance(q, cls.tensor_type) and cls.supports(q, device, torch.bfloat16)):
                continue
            try:
                built.append((name, choose_kernel(q, device, torch.bfloat16, [path])))
            except UnsupportedError as e:
                print(f"{shape:>12} {name} {path}: skipped ({e})")
    return built


def dense(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    layer.weight = nn.Parameter(weight, requires_grad=False)
    return layer


RUNNING = contextlib.ExitStack()  # the engine's fused one-row linears, kept for the whole run


def runner(module: nn.Module, x: torch.Tensor, compile: bool) -> Callable[[], torch.Tensor]:
    if compile:
        RUNNING.enter_context(fused_row_linears(module))
    forward = compiled_step(module, x.device) if compile else module
    return lambda: forward(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["4096x4096", "4096x14336", "576x1536", "1536x576"],
                   help="in x out; the last two are SmolLM2-135M's gate/up and down projections (576 = 4x128 + 64)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="time every forward through torch.compile")
    args = p.parse_args()
    device = resolve_device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}"
          + (", torch.compile" if args.compile else ", eager"))
    print(f"{'shape':>12} {'batch':>5} {'path':<40} {'µs':>10} {'vs fp32':>8} {'vs bf16':>8}")
    for shape in args.shapes:
        n_in, out = (int(v) for v in shape.split("x"))
        w = torch.randn(out, n_in, device=device) * 0.02
        w16 = w.bfloat16()
        kernels = kernels_for(w, device, shape)
        for batch in args.batches:
            x = torch.randn(batch, n_in, device=device)
            x16 = x.bfloat16()
            fp32 = median_us(runner(dense(w), x, args.compile), device, args.repeats)
            bf16 = median_us(runner(dense(w16), x16, args.compile), device, args.repeats)
            rows = [("dense fp32", fp32), ("dense bf16", bf16)]
            rows += [(f"{name} {kernel.path}", median_us(runner(kernel, x16, args.compile), device, args.repeats))
                     for name, kernel in kernels]
            for label, us in rows:
                print(f"{shape:>12} {batch:>5} {label:<40} {us:>10.1f} {fp32 / us:>7.2f}x {bf16 / us:>7.2f}x")


if __name__ == "__main__":
    main()
