import json
from pathlib import Path

import torch

from quantlab.models import bundled_models, load_model
from quantlab.run.recipe import ModelSpec


def test_local_folder_loads_with_its_tokenizer(small_model_dir: Path) -> None:
    loaded = load_model(ModelSpec(path=str(small_model_dir)))
    assert loaded.model.config.num_key_value_heads == 2
    assert loaded.tokenizer("def f(): pass")["input_ids"]
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_synthetic_model_from_a_config_is_seeded_and_has_no_tokenizer(small_model_dir: Path) -> None:
    spec = ModelSpec(config=str(small_model_dir / "config.json"), synthetic=True, dtype="bfloat16")
    a, b = load_model(spec, seed=3), load_model(spec, seed=3)
    assert a.tokenizer is None
    assert next(a.model.parameters()).dtype == torch.bfloat16
    pa, pb = a.model.model.layers[0].mlp.up_proj.weight, b.model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(pa, pb)
    real = load_model(ModelSpec(path=str(small_model_dir))).model.model.layers[0].mlp.up_proj.weight
    assert pa.shape == real.shape


def test_bundled_model_is_a_small_gqa_llama() -> None:
    folder = bundled_models()["tiny-stdlib-llama"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["hidden_act"] == "silu"
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size < 25 * 1024 * 1024
