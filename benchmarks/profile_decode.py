"""Where one decode step's time goes: torch's profiler over timed steps of a real model shape (random weights).

    python benchmarks/profile_decode.py [--shape smollm2-135m] [--format int4-g32] [--engine compiled]
        [--attention sdpa|eager] [--skip-module-guards] [--steps 20]

Builds the shape from its published configuration, applies the format, prefills a 128-token prompt, warms the
engine up (compilation included), then profiles ``--steps`` decode steps of the engine's own loop
(``quantlab.measure.latency.Generation``). Prints the median step (ms) and the operators by self time, so the
shares of the quantized matmuls, the output head, attention, the compiled graph's own kernels and dynamo's guard
checks can be read off. Two settings the compiled engine does not use yet can be tried: ``--attention eager``
(the attention as plain matmuls and softmax, which inductor fuses, instead of the fused SDPA kernel) and
``--skip-module-guards`` (dynamo skips its guards on module attributes; safe only while the model is not changed
after compilation).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig

from decode import FORMATS, SHAPES, build
from quantlab.kv import KV_FORMATS
from quantlab.measure import latency


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    p.add_argument("--format", choices=FORMATS, default="int4-g32")
    p.add_argument("--engine", choices=["eager", "compiled"], default="compiled")
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--skip-module-guards", action="store_true")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rows", type=int, default=15)
    args = p.parse_args()
    cpu = torch.device("cpu")
    model = build(args.format, LlamaConfig(max_position_embeddings=8192, **SHAPES[args.shape]), cpu)
    model.config._attn_implementation = args.attention
    compiled = args.engine == "compiled"
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe} if args.skip_module_guards else {}
    with latency.inductor_options(cpu) if compiled else contextlib.nullcontext():
        step = torch.compile(model.forward, dynamic=False, options=options or None) if compiled else None
        gen = latency.Generation(model, KV_FORMATS["native"].build(), cpu, step,
                                 args.prompt_tokens + 8 + args.steps if compiled else None)
        gen.prefill(torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens)))
        gen.decode(8)  # compilation and warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            times = gen.decode(args.steps)
    print(f"{args.shape} {args.format}, engine {args.engine}, attention {args.attention}, module guards "
          f"{'skipped' if args.skip_module_guards else 'kept'}, {torch.get_num_threads()} threads: median step "
          f"{statistics.median(times):.2f} ms (p10 {sorted(times)[len(times) // 10]:.2f}) over {args.steps} steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
