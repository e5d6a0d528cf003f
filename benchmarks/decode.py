"""Decode speed of a real model shape (random weights) for every weight format, with its roofline share.

    python benchmarks/decode.py --shape llama-3.2-1b [--formats bf16 int8 int4-g128] [--layers N] [--rounds 3]
    python benchmarks/decode.py --shape smollm2-135m --formats int4-g32 --kv native fp8 int8 int4 int2 int2-kivi \
        --positions 512 2048 4096 --engines compiled

Builds the model from its published configuration (no weights are downloaded), applies each format once,
then times greedy decoding with each engine (``eager``: DynamicCache; ``compiled``: static cache +
torch.compile, with the options recorded in results; ``auto``: compiled where it captures), warm-up first,
device synchronized. The formats are interleaved round by round (every format once per round), so a change in
the machine's load touches them all alike; each figure is the median over the rounds' steps. It prints ms/token
with p10–p90, tokens/s, the ratio to bf16, and the share of the memory-bandwidth roofline: bytes one step reads
(weights + KV cache) / the copy bandwidth measured first. ``--layers`` keeps only the first N layers (a quick
check on small machines). ``--kv`` prints the KV table instead: every weight format × KV format × prompt length
in ``--positions``, interleaved the same way, with the ratio to the native cache at the same length.
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, PretrainedConfig

from quantlab import quantize_
from quantlab.engine import DecodeResult
from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.engine.device import resolve_device
from quantlab.engine.memory import decode_weight_bytes_read
from quantlab.engine.torch.decode import measure_decode
from quantlab.extend import WEIGHT_FORMATS
from quantlab.kv import KV_FORMATS
from quantlab.measurements.roofline import Roofline

SHAPES = {  # published architecture numbers
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),
    # SmolLM2-135M: 576-wide inputs, so groups of 128 end in a group of 64.
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True),
    # Gemma 3 270M: 15 sliding (window 512) and 3 global layers, one KV head of 256.
    "gemma3-270m": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, vocab_size=262144, tie_word_embeddings=True,
                        sliding_window=512, query_pre_attn_scalar=256),
}
CONFIGS = {"gemma3-270m": Gemma3TextConfig}  # the others are Llama shapes
KV = {  # the KV table's formats: name -> (registered format, fields)
    "native": ("native", {}),
    "fp8": ("fp8", {}),
    "int8": ("int8", {"group_size": 64, "residual_tokens": 128}),
    "int4": ("int4", {"group_size": 64, "residual_tokens": 128}),
    "int2": ("int2", {"group_size": 64, "residual_tokens": 128}),
    "int2-kivi": ("int2", {"key_axis": "channel", "group_size": 32, "residual_tokens": 128}),
    "nvfp4": ("nvfp4", {"residual_tokens": 128}),
    "mxfp4-rot": ("mxfp4", {"residual_tokens": 128, "rotate": "hadamard"}),
    "int4-rot": ("int4", {"group_size": 64, "residual_tokens": 128, "rotate": "hadamard"}),
}
BF16 = {"compute_dtype": "bfloat16"}
FORMATS = {
    "bf16": ("bf16", {}),
    "int8": ("int8", BF16),
    "int4-pc": ("int4", BF16),
    "int4-g128": ("int4", {"group_size": 128, **BF16}),
    "int4-g32": ("int4", {"group_size": 32, **BF16}),
    "int4-g32-fz": ("int4", {"group_size": 32, "zero_point": "float", **BF16}),  # Q4_1's form: a float zero point
    "int3-g128": ("int3", {"group_size": 128, **BF16}),
    "int2-g64": ("int2", {"group_size": 64, **BF16}),
    "int4-g128-dequant": ("int4", {"group_size": 128, "kernel": "dequantize+matmul", **BF16}),
    "nf4": ("nf4", BF16),  # block 64, float32 maxima: the 4-bit codebook kernel (lut4_cpu on CPU)
    "nf4-dq": ("nf4", {"double_quant": True, **BF16}),  # QLoRA's storage: 8-bit maxima
    "fp4": ("fp4", BF16),
    "hqq4-g64": ("hqq", {"bits": 4, "group_size": 64, **BF16}),
    "fp8": ("fp8", BF16),
    "gguf-q4_k_m": ("gguf", {"recipe": "Q4_K_M", **BF16}),  # llama.cpp's mix, ggml's blocks (ggml_q8_cpu)
    "gguf-q4_k": ("gguf", {"type": "Q4_K", **BF16}),
    "gguf-q6_k": ("gguf", {"type": "Q6_K", **BF16}),
    "gguf-q8_0": ("gguf", {"type": "Q8_0", **BF16}),
    "gguf-q3_k": ("gguf", {"type": "Q3_K", **BF16}),
    "gguf-q4_0": ("gguf", {"recipe": "Q4_0", **BF16}),  # llama.cpp's mixes of the repacked types (ggml_repack_cpu)
    "gguf-iq4_nl": ("gguf", {"recipe": "IQ4_NL", **BF16}),
    "mxfp4": ("mxfp4", BF16),  # e2m1 codes through a table, e8m0 scales (e2m1_lut_cpu)
    "nvfp4": ("nvfp4", BF16),  # e2m1 codes, e4m3 scales over a global one (e2m1_lut_cpu)
    "mxfp8": ("mxfp8", BF16),  # e4m3 codes widened in registers, e8m0 scales (mxfp8_cpu)
    "fp8-b128": ("fp8", {"block_size": 128, **BF16}),  # a scale per 128x128 tile (fp8_block_cpu)
    "nvfp4-a4": ("nvfp4", {"activations": "nvfp4", **BF16}),  # W4A4: the activations' rounding emulated
    "int8-sym": ("int8", {"symmetric": True, **BF16}),  # W8A16: the weight-only baseline of W8A8
    "int8-a8": ("int8", {"symmetric": True, "activations": "int8", **BF16}),  # W8A8: int8 x int8 (int8_act_cpu)
    "int4-g32-a8": ("int4", {"group_size": 32, "activations": "int8", **BF16}),  # W4A8 (int8_act_cpu)
    # float32 activations: on CPUs without bf16 instructions torch's bf16 int8 kernel is far from its best
    "int8-sym-fp32": ("int8", {"symmetric": True, "compute_dtype": "float32"}),  # W8A16 in float32 (bitplane_cpu)
    "int8-a8-fp32": ("int8", {"symmetric": True, "activations": "int8", "compute_dtype": "float32"}),
}
DEFAULT_FORMATS = ["bf16", "int8", "int4-g128", "int4-g128-dequant"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=SHAPES, default="llama-3.2-1b")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=DEFAULT_FORMATS)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (every format once per round)")
    p.add_argument("--device", default="auto")
    p.add_argument("--engines", nargs="+", choices=["eager", "compiled", "auto"], default=["eager", "compiled"])
    p.add_argument("--kv", nargs="+", choices=KV, default=None, help="print the KV table for these KV formats")
    p.add_argument("--positions", nargs="+", type=int, default=[512, 2048, 4096], help="the KV table's prompt lengths")
    args = p.parse_args()
    device = resolve_device(args.device)
    config = shape_config(args.shape, args.layers)
    shape = config.to_dict()
    bandwidth = copy_bandwidth_bytes_per_s(device)
    print(f"{args.shape} ({shape['num_hidden_layers']} layers), device {device}, copy bandwidth {bandwidth / 1e9:.1f} GB/s, "
          f"batch {args.batch_size}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, {args.rounds} round(s)")
    models = {name: build(name, config, device) for name in args.formats}
    if args.kv:
        for engine in args.engines:
            kv_table(engine, args, models, bandwidth, device)
        return
    print(f"{'engine':<9} {'format':<18} {'kernel':<22} {'weights MB':>10} {'ms/token (p10–p90)':>24} {'tok/s':>8} "
          f"{'vs bf16':>8} {'roofline':>9}")
    for engine in args.engines:
        run_engine(engine, args, models, bandwidth, device)


def shape_config(shape: str, layers: int | None = None) -> PretrainedConfig:
    fields = dict(SHAPES[shape], **({"num_hidden_layers": layers} if layers else {}))
    if shape in CONFIGS:
        return CONFIGS[shape](max_position_embeddings=8192, **fields)
    return LlamaConfig(max_position_embeddings=8192, rope_theta=500000.0, **fields)


def kv_table(engine: str, args: argparse.Namespace, models: dict[str, torch.nn.Module], bandwidth: float,
             device: torch.device) -> None:
    """Every weight format x KV format x prompt length, interleaved round by round; the ratio is to the native
    cache's step at the same weight format and length."""
    kvs = {name: KV_FORMATS[KV[name][0]].build(**KV[name][1]) for name in args.kv}
    cells = [(w, k, n) for n in args.positions for w in models for k in kvs]
    result = interleaved(cells, lambda cell: (models[cell[0]], kvs[cell[1]], cell[2]), engine, args, device)
    print(f"{'engine':<9} {'weights':<10} {'KV':<10} {'positions':>9} {'KV MB':>8} {'MB read/step':>12} "
          f"{'ms/token (p10–p90)':>24} {'vs native':>9} {'roofline':>9} {'prefill ms':>10}  engine used")
    for cell in cells:
        w, k, n = cell
        r, row = result[cell], roofline_row(result[cell], models[w], n, bandwidth, args)
        native = result.get((w, "native", n))
        ratio = (f"{row['decode_ms_per_token'] / statistics.median(native.decode_ms):>8.2f}x" if native
                 else f"{'—':>9}")
        spread = f"{row['decode_ms_per_token']:.2f} ({row['decode_ms_p10']:.2f}–{row['decode_ms_p90']:.2f})"
        used = r.engine_options.get("engine_choice", r.engine)
        print(f"{engine:<9} {w:<10} {k:<10} {n:>9} {row['kv_cache_bytes'] / 1e6:>8.2f} "
              f"{row['decode_bytes_read_per_step'] / 1e6:>12.1f} {spread:>24} {ratio} {row['roofline_share']:>8.1%} "
              f"{row['prefill_ms']:>10.0f}  {used}")


def build(name: str, config: PretrainedConfig, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    fmt_name, params = FORMATS[name]
    quantize_(model, WEIGHT_FORMATS[fmt_name].build(**params))
    return model


def interleaved(cells: list, what: Callable[..., tuple], engine: str, args: argparse.Namespace,
                device: torch.device, done: Callable[[Any, DecodeResult], None] | None = None) -> dict:
    """Each cell's measurement, the cells taken in turn round by round (``what(cell)``: model, KV format, prompt
    tokens); a cell's result holds every round's steps. ``done(cell, result)`` is called as each cell's last round
    ends (so a run stopped part way has printed what it measured)."""
    steps: dict = {cell: [] for cell in cells}
    result = {}
    for round_ in range(args.rounds):
        for cell in cells:
            model, kv, prompt = what(cell)
            result[cell] = measure_decode(model, kv, batch_size=args.batch_size, prompt_tokens=prompt,
                                          new_tokens=args.new_tokens, warmup_runs=1, prefill_repeats=1, seed=0,
                                          device=device, engine=engine)
            steps[cell] += result[cell].decode_ms
            if round_ == args.rounds - 1:
                result[cell].decode_ms = steps[cell]
                if done is not None:
                    done(cell, result[cell])
    return result


def roofline_row(result: DecodeResult, model: torch.nn.Module, prompt_tokens: int, bandwidth: float,
                 args: argparse.Namespace) -> dict:
    """The result's record with the weight bytes one step reads and its roofline share (the KV cache at the mean
    length of one generation)."""
    row = {**result.record(args.batch_size), "decode_weight_bytes_read": decode_weight_bytes_read(model),
           "prompt_tokens": prompt_tokens, "memory_bandwidth_bytes_per_s": bandwidth, "decode_steps": args.new_tokens}
    row.update(Roofline().derive(row).model_dump())
    return row


def run_engine(engine: str, args: argparse.Namespace, models: dict[str, torch.nn.Module], bandwidth: float,
               device: torch.device) -> None:
    native = KV_FORMATS["native"].build()
    base: dict[str, float] = {}  # the first format's speed (bf16 where listed first)

    def show(name: str, result: DecodeResult) -> None:
        model = models[name]
        row = roofline_row(result, model, args.prompt_tokens, bandwidth, args)
        base.setdefault("tok/s", row["tokens_per_s"])
        kernels = sorted({m.kernel_path for m in model.modules() if hasattr(m, "kernel_path")}) or ["dense"]
        spread = f"{row['decode_ms_per_token']:.2f} ({row['decode_ms_p10']:.2f}–{row['decode_ms_p90']:.2f})"
        print(f"{engine:<9} {name:<18} {','.join(kernels):<22} {row['decode_weight_bytes_read'] / 1e6:>10.1f} "
              f"{spread:>24} {row['tokens_per_s']:>8.2f} {row['tokens_per_s'] / base['tok/s']:>7.2f}x "
              f"{row['roofline_share']:>8.1%}", flush=True)

    interleaved(list(models), lambda name: (models[name], native, args.prompt_tokens), engine, args, device, show)

if __name__ == "__main__":
    main()
