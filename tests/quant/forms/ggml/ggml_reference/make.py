"""Writes the reference blocks the tests compare quantlab's ggml quantizer with, from llama.cpp's own quantizer
(llama-cpp-python 0.3.36's ggml): ``python -m tests.quant.forms.ggml.ggml_reference.make``. The input is a fixed
tensor of 8 rows of 768 (three super-blocks): gaussian weights, a row with outliers, a row of zeros, a row of one
repeated value, and a heavy-tailed importance matrix; ``blocks.json`` keeps each type's sha256 of its blocks."""
import hashlib
import json
from pathlib import Path

import numpy as np

from quantlab.quant.forms.ggml.tensor import FLOAT_SUBSTITUTE, GGML_TYPES
from tests.quant.forms.ggml.ggml_llama_cpp import ggml_library, llama_cpp_blocks

HERE = Path(__file__).parent


def reference_input() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 768)) * 0.02).astype(np.float32)
    x[1, ::37] *= 40  # outliers
    x[2] = 0
    x[3] = 0.0125
    x[4] = np.abs(x[4])  # one sign only
    imatrix = (rng.random(768) ** 4 * 50 + 1e-3).astype(np.float32)
    return x, imatrix


def main() -> None:
    lib = ggml_library()
    if lib is None:
        raise SystemExit("needs llama-cpp-python")
    x, imatrix = reference_input()
    np.save(HERE / "input.npy", x)
    np.save(HERE / "imatrix.npy", imatrix)
    digests = {}
    for name, t in GGML_TYPES.items():
        if name == FLOAT_SUBSTITUTE:
            continue
        for label, weights in (("plain", None), ("imatrix", imatrix)):
            blocks = llama_cpp_blocks(lib, t.ggml_id, x, weights)
            digests[f"{name} {label}"] = hashlib.sha256(blocks.tobytes()).hexdigest()
    (HERE / "blocks.json").write_text(json.dumps({"source": "llama-cpp-python 0.3.36 (ggml_quantize_chunk)",
                                                  "sha256": digests}, indent=1) + "\n")


if __name__ == "__main__":
    main()
