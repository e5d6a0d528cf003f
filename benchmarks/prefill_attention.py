"""A prompt's attention on the CPU: quantlab's query chunks against PyTorch's fused SDPA kernel, in whole prefills.

    python benchmarks/prefill_attention.py [--model smollm2|gemma3] [--variant gguf-q4_0] [--tokens 128 512 2048]
        [--rounds 5]

Loads the model from its GGUF file (vs_llamacpp.py's models and variants), builds the compiled engine with the native
cache, and at each prompt length times whole prefills (``Generation.prefill``: the forward and the last position's
head) with the engine's attention taking the prompt in chunks (``chunked_attention``), then with the same attention
handing the prompt to transformers' SDPA forward instead, alternating round by round in one process (each round: one
untimed prefill, then one timed, per side). Prints the median prefill of each, their ratio, and the minor page faults
a timed prefill took.
"""
from __future__ import annotations

import argparse
import resource
import statistics
from typing import Any

import torch
import vs_llamacpp as bench
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from quantlab import quantize_
from quantlab.engine.torch import attention
from quantlab.engine.torch.decode import DecodeEngine
from quantlab.models import ModelSpec, load_model
from quantlab.quant.format import build_format


class _Module:
    is_causal, training = True, False
    num_key_value_groups = 1


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, scaling: float) -> torch.Tensor:
    _Module.num_key_value_groups = query.shape[1] // key.shape[1]
    return sdpa_attention_forward(_Module, query, key, value, mask, scaling=scaling)[0]  # type: ignore[arg-type]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(bench.MODELS), default="smollm2")
    p.add_argument("--variant", choices=[v for v in bench.VARIANTS if v.startswith("gguf-")], default="gguf-q4_0")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    model = bench.MODELS[args.model]
    m = load_model(ModelSpec(package=model.package, gguf_file=model.gguf, dtype="bfloat16")).model
    quantize_(m, build_format(bench.VARIANTS[args.variant]))
    chunked = attention.chunked_attention
    print(f"{args.model} {args.variant}, {torch.get_num_threads()} threads, compiled engine, native cache, "
          f"{args.rounds} rounds")
    for tokens in args.tokens:
        engine = DecodeEngine(m, bench._kv_format("native"), torch.device("cpu"), "compiled", tokens + 16)
        with engine:
            prompt = torch.randint(0, m.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
            engine.warm_up(prompt[:, :64], 2)
            times: dict[str, list[float]] = {"chunks": [], "sdpa": []}
            faults = dict.fromkeys(times, 0)
            try:
                for _ in range(args.rounds):
                    for side, function in (("chunks", chunked), ("sdpa", _sdpa)):
                        attention.chunked_attention = function
                        engine.generation().prefill(prompt)
                        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                        times[side].append(engine.generation().prefill(prompt))
                        faults[side] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            finally:
                attention.chunked_attention = chunked
        median = {side: statistics.median(ts) for side, ts in times.items()}
        print(f"{tokens:>6} tokens: chunks {median['chunks']:9.1f} ms, sdpa {median['sdpa']:9.1f} ms, "
              f"chunks / sdpa {median['chunks'] / median['sdpa']:.2f}; page faults a prefill "
              f"{faults['chunks'] / args.rounds:.0f} / {faults['sdpa'] / args.rounds:.0f}", flush=True)


if __name__ == "__main__":
    main()
