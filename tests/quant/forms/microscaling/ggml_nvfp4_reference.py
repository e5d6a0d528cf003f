"""The input and ggml's NVFP4 blocks for it, kept for machines without llama-cpp-python.

    python -m tests.quant.forms.microscaling.ggml_nvfp4_reference   # needs llama-cpp-python 0.3.36

writes ``data/ggml_nvfp4_blocks.npy``: ``quantize_row_nvfp4_ref`` of llama.cpp's ggml (libggml-base from
llama-cpp-python) over ``reference_input()``."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import torch

BLOCKS = Path(__file__).parent / "data" / "ggml_nvfp4_blocks.npy"


def reference_input() -> torch.Tensor:
    """Rows of every magnitude from 1e-6 to 1e3, an all-zero block, every e2m1 midpoint (ties), and a block past
    e4m3's largest scale."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-6, 3, 64).unsqueeze(1)
    x[0, :16] = 0
    x[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -6])
    x[2, :16] = torch.linspace(-3000, 3000, 16)
    x[3, :16] = 1e-7
    return x.contiguous()


def ggml_blocks(x: torch.Tensor) -> np.ndarray | None:
    """ggml's own NVFP4 blocks of ``x [rows, in]`` (``[rows, in / 64 * 36]`` bytes), or None without llama-cpp-python."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        return None
    lib = ctypes.CDLL(str(Path(spec.origin).parent / "lib" / "libggml-base.so"))
    lib.quantize_row_nvfp4_ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = x.float().contiguous()
    out = np.zeros((x.shape[0], x.shape[1] // 64 * 36), dtype=np.uint8)
    lib.quantize_row_nvfp4_ref(x.data_ptr(), out.ctypes.data, x.numel())
    return out


if __name__ == "__main__":
    BLOCKS.parent.mkdir(exist_ok=True)
    np.save(BLOCKS, ggml_blocks(reference_input()))
    print(BLOCKS)
