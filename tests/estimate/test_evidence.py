import json
from pathlib import Path

import pytest

from quantlab import QuantlabError
from quantlab.estimate import read_architecture, read_raw_config

CONFIGS = Path(__file__).parents[2] / "evals" / "configs"


def _rows(name: str) -> dict[str, tuple[object, str, str]]:
    raw, _ = read_raw_config(str(CONFIGS / name))
    return {e.meaning: (e.value, e.kind, e.source) for e in read_architecture(raw).evidence}


def test_gpt2_evidence_table_separates_file_facts_from_implementation_facts() -> None:
    rows = _rows("gpt2.json")
    assert rows["residual width"] == (768, "file", "n_embd")
    assert rows["layers"] == (12, "file", "n_layer")
    assert rows["query heads"] == (12, "file", "n_head")
    assert rows["position limit"] == (1024, "file", "n_positions")
    assert rows["vocabulary"][:2] == (50257, "file")
    # Not in the file: established by the transformers implementation, and said so.
    assert rows["KV heads"][:2] == (12, "implementation")
    assert rows["head width"][:2] == (64, "implementation") and "768 / 12" in rows["head width"][2]
    assert rows["MLP width"][:2] == (3072, "implementation") and "n_inner or 4" in rows["MLP width"][2]
    assert rows["tied embeddings"][:2] == (True, "implementation")
    assert rows["attention pattern"][0] == "global in all 12 layers"


def test_gemma3_1b_evidence_table_takes_the_explicit_head_width() -> None:
    rows = _rows("gemma-3-1b.json")
    assert rows["residual width"] == (1152, "file", "hidden_size")
    assert rows["layers"] == (26, "file", "num_hidden_layers")
    assert rows["query heads"] == (4, "file", "num_attention_heads")
    assert rows["KV heads"] == (1, "file", "num_key_value_heads")
    assert rows["head width"] == (256, "file", "head_dim")  # not 1152 / 4 = 288
    assert rows["position limit"] == (32768, "file", "max_position_embeddings")
    assert rows["sliding window"] == (512, "file", "sliding_window")
    value, kind, source = rows["attention pattern"]
    assert value.startswith("22 sliding (window 512) and 4 global layers: 5 local : 1 global")
    assert kind == "implementation" and "sliding_window_pattern=6" in source
    assert rows["tied embeddings"][:2] == (True, "implementation")


def test_a_sliding_window_without_layer_types_makes_every_layer_sliding_as_transformers_does() -> None:
    assert _rows("mistral-7b.json")["attention pattern"][0] == "sliding window 4096 in all 32 layers"
    assert _rows("qwen2.5-7b.json")["attention pattern"][0] == "global in all 28 layers"  # use_sliding_window false


def test_an_unknown_architecture_lists_what_it_cannot_interpret_and_guesses_nothing() -> None:
    arch = read_architecture({"model_type": "mystery-lm", "d_model": 512, "n_layers": 8, "n_heads": 8, "vocab_size": 100})
    assert arch.hidden_size == 512 and arch.num_hidden_layers == 8 and arch.num_attention_heads == 8
    assert arch.head_dim is None and arch.num_key_value_heads is None  # no 512 / 8, no "same as query heads"
    missing = " ".join(arch.not_interpreted)
    assert "KV heads" in missing and "head width" in missing and "MLP width" in missing


def test_config_sources_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(QuantlabError, match="no such config file"):
        read_raw_config(str(tmp_path / "nope.json"))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(QuantlabError, match="not valid JSON"):
        read_raw_config(str(tmp_path))  # a folder holding config.json
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(QuantlabError, match="JSON object"):
        read_raw_config(str(bad))
