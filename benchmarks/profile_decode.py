"""Where one decode step's time goes: torch's profiler over timed steps of a real model shape (random weights).

    python benchmarks/profile_decode.py [--shape smollm2-135m] [--format int4-g32] [--engine compiled]
        [--kv int8] [--prompt-tokens 4096] [--attention quantlab|sdpa|eager] [--module-guards kept] [--steps 20]
    python benchmarks/profile_decode.py --device cuda --shape llama-3.1-8b --layers 2 --format mxfp4

Builds the shape from its published configuration, applies the format, prefills a prompt (128 tokens by default)
through the KV format's cache (``--kv``: the names of decode.py's KV table), warms the
engine up (compilation included), then profiles ``--steps`` decode steps of the engine's own loop
(``quantlab.engine.torch.decode.Generation``). Prints the median step (ms) and the operators by self time, so the
shares of the quantized matmuls, the output head, attention, the compiled graph's own kernels and dynamo's guard
checks can be read off. The compiled engine's CPU settings can be undone to see what each saves:
``--attention sdpa`` or ``eager`` (the fused SDPA kernel, or transformers' matmuls with ``repeat_kv``, instead of
quantlab's grouped attention), ``--module-guards kept`` (dynamo checks its guards on module attributes at every step) and
``--half-linears fused_row_matmul`` or ``aten`` (bf16 linears, the output head among them, through inductor's
one-row loop or ``aten::mm`` instead of the C kernel) and ``--inductor realize_opcount_threshold=None`` (any inductor setting over the engine's: here,
pointwise chains inlined into the one-row matmuls' loops again). On CUDA (``--device cuda``) the engine keeps its
CUDA settings (CUDA graphs, gpt-fast's inductor flags), the kernels are ranked by their GPU time, and the graphs
and graph breaks dynamo made for the step are counted first.
"""
from __future__ import annotations

import argparse
import ast
import statistics

import torch
from decode import FORMATS, KV, SHAPES, build, shape_config
from torch.profiler import ProfilerActivity, profile

from quantlab.engine.torch import compiled
from quantlab.engine.torch import decode as latency
from quantlab.kv import KV_FORMATS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    p.add_argument("--format", choices=FORMATS, default="int4-g32")
    p.add_argument("--engine", choices=["eager", "compiled"], default="compiled")
    p.add_argument("--attention", choices=["quantlab", "sdpa", "eager"], default="quantlab",
                   help="quantlab: the engines' grouped attention (quantlab-fused over a quantized cache)")
    p.add_argument("--module-guards", choices=["skipped", "kept"], default="skipped")
    p.add_argument("--half-linears", choices=["half_rows", "fused_row_matmul", "aten"],
                   default=compiled.compile_options(torch.device("cpu"))["half_linears"])
    p.add_argument("--inductor", nargs="*", default=[], metavar="KEY=VALUE",
                   help="inductor settings over the engine's (values as Python literals)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--kv", choices=KV, default="native", help="the KV cache format (decode.py's KV table names)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N layers")
    p.add_argument("--rows", type=int, default=15)
    args = p.parse_args()
    device = torch.device(args.device)
    inductor = {k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in args.inductor)}
    model = build(args.format, shape_config(args.shape, args.layers), device)
    kv = KV_FORMATS[KV[args.kv][0]].build(**KV[args.kv][1])
    options = ({"attention": args.attention, "module_guards": args.module_guards, "half_linears": args.half_linears}
               if device.type == "cpu" else {})
    engine = latency.DecodeEngine(model, kv, device, args.engine, args.prompt_tokens + 8 + args.steps,
                                  {**options, "inductor": {**compiled.compile_options(device)["inductor"], **inductor}})
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    torch._dynamo.utils.counters.clear()
    with engine:
        gen = engine.generation()
        gen.prefill(torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens), device=device))
        gen.decode(8)  # compilation and warm-up
        with profile(activities=activities) as prof:
            times = gen.decode(args.steps)
    counters = torch._dynamo.utils.counters
    breaks = sum(counters["graph_break"].values())
    print(f"dynamo: {counters['stats'].get('unique_graphs', 0)} graphs, {breaks} graph breaks"
          + "".join(f"\n  break: {reason[:160]} (x{n})" for reason, n in list(counters["graph_break"].items())[:5]))
    settings = (f", attention {engine.options.get('attention')}, module guards {engine.options.get('module_guards')}, "
                f"half-precision linears {engine.options.get('half_linears')}, mode {engine.options.get('mode')}, "
                f"inductor {engine.options['inductor']}" if engine.compiled else "")
    threads = f"{torch.get_num_threads()} threads" if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"{args.shape} {args.format}, engine {args.engine}{settings}, {threads}: median step "
          f"{statistics.median(times):.2f} ms (p10 {sorted(times)[len(times) // 10]:.2f}) over {args.steps} steps")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows))


if __name__ == "__main__":
    main()
