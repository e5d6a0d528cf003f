from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

BUNDLED = Path(__file__).resolve().parents[1] / "quantlab" / "bundled" / "tiny-stdlib-llama"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from quantlab.engine.llama_cpp import process as llama_cpp

    skips = {"gpu": None if torch.cuda.is_available() else "needs a CUDA device",
             "llama_cpp": None if llama_cpp.available() else llama_cpp.INSTALL}
    for item in items:
        for marker, reason in skips.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in float32 (Frobenius norms)."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def make_llama(**overrides: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)
    kwargs.update(overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**kwargs)).eval()


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Llama (hidden 128, GQA 4:2) saved with the bundled tokenizer: the real loading path, fast."""
    out = tmp_path_factory.mktemp("small-llama")
    make_llama().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BUNDLED / name, out / name)
    return out
