"""Decode speed of a real model shape (random weights) for every weight format, with its roofline share.

    python benchmarks/decode.py --shape llama-3.2-1b [--formats bf16 int8 int4-g128] [--layers N]

Builds the model from its published configuration (no weights are downloaded), applies each
format, and times greedy decoding with each engine (``eager``: DynamicCache; ``compiled``: static
cache + torch.compile, with the options recorded in results), warm-up first, device synchronized. It prints tokens/s, the ratio to bf16, and the share of the memory-bandwidth
roofline: bytes one step reads (weights + KV cache) / the copy bandwidth measured first.
``--layers`` keeps only the first N layers (a quick check on small machines).
"""
from __future__ import annotations

import argparse
import gc

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from quantlab import WEIGHT_FORMATS, quantize_
from quantlab.kv import KV_FORMATS
from quantlab.measure.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.measurements.roofline import Roofline
from quantlab.measure.device import resolve_device
from quantlab.measure.latency import measure_decode
from quantlab.measure.memory import decode_weight_bytes_read

SHAPES = {  # published architecture numbers
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),
}
FORMATS = {
    "bf16": ("bf16", {}),
    "int8": ("int8", {"compute_dtype": "bfloat16"}),
    "int4-g128": ("int4", {"group_size": 128, "compute_dtype": "bfloat16"}),
    "int4-g128-dequant": ("int4", {"group_size": 128, "compute_dtype": "bfloat16", "kernel": "dequantize+matmul"}),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=SHAPES, default="llama-3.2-1b")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--engines", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    args = p.parse_args()
    device = resolve_device(args.device)
    shape = dict(SHAPES[args.shape], **({"num_hidden_layers": args.layers} if args.layers else {}))
    config = LlamaConfig(max_position_embeddings=8192, rope_theta=500000.0, **shape)
    bandwidth = copy_bandwidth_bytes_per_s(device)
    print(f"{args.shape} ({shape['num_hidden_layers']} layers), device {device}, copy bandwidth {bandwidth / 1e9:.1f} GB/s, "
          f"batch {args.batch_size}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens")
    print(f"{'engine':<9} {'format':<20} {'kernel':<22} {'weights GB':>10} {'ms/token':>9} {'tok/s':>8} {'vs bf16':>8} {'roofline':>9}")
    for engine in args.engines:
        run_engine(engine, args, config, bandwidth, device)


def run_engine(engine: str, args: argparse.Namespace, config: LlamaConfig, bandwidth: float, device: torch.device) -> None:
    base = None
    for name in args.formats:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        fmt_name, params = FORMATS[name]
        quantize_(model, WEIGHT_FORMATS[fmt_name].build(**params))
        kernels = sorted({m.kernel_path for m in model.modules() if hasattr(m, "kernel_path")}) or ["dense"]
        result = measure_decode(model, KV_FORMATS["native"].build(), batch_size=args.batch_size,
                                prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, warmup_runs=1,
                                prefill_repeats=1, seed=0, device=device, engine=engine)
        row = {**result.record(args.batch_size), "decode_weight_bytes_read": decode_weight_bytes_read(model),
               "prompt_tokens": args.prompt_tokens, "memory_bandwidth_bytes_per_s": bandwidth}
        row.update(Roofline().derive(row).model_dump())
        base = base or row["tokens_per_s"]
        print(f"{engine:<9} {name:<20} {','.join(kernels):<22} {row['decode_weight_bytes_read'] / 1e9:>10.3f} "
              f"{row['decode_ms_per_token']:>9.2f} {row['tokens_per_s']:>8.2f} {row['tokens_per_s'] / base:>7.2f}x "
              f"{row['roofline_share']:>8.1%}")
        del model
        gc.collect()


if __name__ == "__main__":
    main()
