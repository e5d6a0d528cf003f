"""GGUF metadata and tokenizer written from a transformers config and tokenizer folder, as llama.cpp's
converter (``convert_hf_to_gguf.py``) writes them, for a model that was not loaded from a GGUF file.

Each architecture writes the hyperparameter keys llama.cpp reads for it; a config setting that llama.cpp's
implementation of that architecture fixes otherwise (Gemma 3's local RoPE base, its layer pattern) is refused
rather than written and silently ignored. Tokenizers: byte-level BPE (``tokenizer.json`` of GPT-2, Llama 3,
SmolLM, Qwen) as llama.cpp's ``gpt2`` model, SentencePiece-style BPE with byte fallback (Llama 2, Mistral,
Gemma) as its ``llama`` model, scored by vocabulary rank as SentencePiece scores its pieces.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import UnsupportedError


def _llama(writer: Any, config: Any) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = _rope(config)
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedError(f"rope_type {rope['rope_type']!r} is not written to GGUF from a config here; "
                               "load the model from its .gguf file")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)


GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's gemma3 fixes the sliding layers' RoPE base
GEMMA3_PATTERN = 6  # and one full-attention layer in six


def _gemma3(writer: Any, config: Any) -> None:
    import gguf

    layers = config.num_hidden_layers
    # llama.cpp scales Gemma 3's queries by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 62-layer 27B
    scalar = config.hidden_size // config.num_attention_heads if layers == 62 else config.head_dim
    if config.query_pre_attn_scalar != scalar:
        raise UnsupportedError(f"query_pre_attn_scalar {config.query_pre_attn_scalar} differs from the {scalar} "
                               "llama.cpp's gemma3 uses for this shape")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, key, None) is not None:
            raise UnsupportedError(f"{key} {getattr(config, key)} is not applied by llama.cpp's gemma3")
    expected = ["full_attention" if (i + 1) % GEMMA3_PATTERN == 0 else "sliding_attention" for i in range(layers)]
    if list(getattr(config, "layer_types", expected)) != expected:
        raise UnsupportedError("layer_types differ from llama.cpp's gemma3 pattern (one full-attention layer in six)")
    rope = _rope(config)
    full, local = rope.get("full_attention", rope), rope.get("sliding_attention", {})
    if float(local.get("rope_theta", GEMMA3_LOCAL_ROPE_BASE)) != GEMMA3_LOCAL_ROPE_BASE \
            or local.get("rope_type", "default") != "default":
        raise UnsupportedError(f"the sliding layers' RoPE ({local}) differs from llama.cpp's gemma3 "
                               f"(default, base {GEMMA3_LOCAL_ROPE_BASE:g})")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(float(full.get("rope_theta", 1_000_000.0)))
    kind = full.get("rope_type", "default")
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(full["factor"]))
    elif kind != "default":
        raise UnsupportedError(f"rope_type {kind!r} is not written to GGUF for gemma3 here")
    writer.add_sliding_window(config.sliding_window)
    writer.add_head_count_kv(config.num_key_value_heads)


GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # llama.cpp's gpt2 uses the tanh approximation


def _gpt2(writer: Any, config: Any) -> None:
    if config.activation_function not in GPT2_ACTIVATIONS:
        raise UnsupportedError(f"activation_function {config.activation_function!r}: llama.cpp's gpt2 computes "
                               f"{' / '.join(GPT2_ACTIVATIONS)}")
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if getattr(config, key, False):
            raise UnsupportedError(f"{key}: true is not computed by llama.cpp's gpt2")
    if not getattr(config, "scale_attn_weights", True):
        raise UnsupportedError("scale_attn_weights: false is not computed by llama.cpp's gpt2")
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)


CONFIG_METADATA: dict[str, Callable[[Any, Any], None]] = {"llama": _llama, "qwen2": _llama, "gemma3": _gemma3,
                                                          "gpt2": _gpt2}


def _rope(config: Any) -> dict[str, Any]:
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})


def metadata_from_config(writer: Any, arch: str, config: Any) -> None:
    """The hyperparameters llama.cpp reads for ``arch``, from a transformers config."""
    write = CONFIG_METADATA.get(arch)
    if write is None:
        raise UnsupportedError(f"GGUF metadata for architecture {arch} is written from the model's source GGUF "
                               f"only (from a config: {', '.join(CONFIG_METADATA)}); load the model from its .gguf "
                               "file")
    write(writer, config)


def tokenizer_from_folder(writer: Any, folder: Path | None) -> None:
    """The tokenizer of ``folder/tokenizer.json`` as llama.cpp reads it, with its special tokens."""
    import gguf

    if folder is None or not (folder / "tokenizer.json").is_file():
        raise UnsupportedError("GGUF needs the tokenizer: give the model's folder (with tokenizer.json) as source")
    spec = json.loads((folder / "tokenizer.json").read_text())
    model = spec.get("model") or {}
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        n_vocab, merges = _sentencepiece_bpe(writer, spec), False
    else:
        n_vocab, merges = _byte_level_bpe(writer, spec, folder), True
    gguf.SpecialVocab(folder, load_merges=merges, n_vocab=n_vocab).add_to_gguf(writer)


def _byte_level_bpe(writer: Any, spec: dict[str, Any], folder: Path) -> int:
    """llama.cpp's ``gpt2`` tokenizer (byte-level BPE, merges apart) with its pre-tokenizer's name; the vocab size."""
    import gguf

    try:
        vocab = gguf.BpeVocab(folder)
    except FileNotFoundError:
        raise UnsupportedError(f"{folder / 'tokenizer.json'}: neither byte-level BPE nor BPE with byte fallback, "
                               "the tokenizers written to GGUF from a folder here") from None
    tokens, types = [], []
    for text, _score, toktype in vocab.all_tokens():
        tokens.append(text)
        types.append(toktype)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer(spec.get("pre_tokenizer") or {}, folder / "tokenizer.json"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    return len(tokens)

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def pre_tokenizer(pre: dict[str, Any], where: Path) -> str:
    """llama.cpp's name for a byte-level BPE pre-tokenizer (the split it applies before BPE): GPT-2's regex
    (``gpt-2``), digits split one by one before it (``smollm``), or the Llama 3 / Qwen 2 split regexes
    (digits in threes or one by one) before a regex-free byte-level step."""
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in steps]
    last = steps[-1] if steps else {}
    if kinds == ["ByteLevel"] and last.get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and last.get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not last.get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex", "")
        if "\\p{N}{1,3}" in regex:
            return "llama-bpe"
        if "|\\p{N}|" in regex:
            return "qwen2"
    raise UnsupportedError(f"{where}: pre_tokenizer {' + '.join(map(str, kinds))} is not one written to GGUF here "
                           "(GPT-2's, SmolLM's, Llama 3's or Qwen 2's); load the model from its .gguf file")


def _vocab_size(spec: dict[str, Any]) -> int:
    ids = list(spec["model"]["vocab"].values()) + [t["id"] for t in spec.get("added_tokens", [])]
    return max(ids) + 1


def _sentencepiece_bpe(writer: Any, spec: dict[str, Any]) -> int:
    """llama.cpp's ``llama`` (SentencePiece) tokenizer: merges follow piece scores, which SentencePiece gives
    as minus the piece's rank among the normal pieces; byte pieces score 0, control and user-defined −1000.
    Returns the vocab size."""
    import gguf

    n = _vocab_size(spec)
    tokens = [""] * n
    types = [gguf.TokenType.UNUSED] * n
    for text, i in spec["model"]["vocab"].items():
        tokens[i] = text
        types[i] = gguf.TokenType.BYTE if BYTE_TOKEN.fullmatch(text) else gguf.TokenType.NORMAL
    for t in spec.get("added_tokens", []):
        tokens[t["id"]] = t["content"]
        types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    scores, rank = [], 0
    for kind in types:
        if kind == gguf.TokenType.NORMAL:
            scores.append(-float(rank))
            rank += 1
        else:
            scores.append(0.0 if kind == gguf.TokenType.BYTE else -1000.0)
    normalizer = json.dumps(spec.get("normalizer") or {}) + json.dumps(spec.get("pre_tokenizer") or {})
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix('"Prepend"' in normalizer or '"prepend_scheme": "always"' in normalizer
                                or '"prepend_scheme": "first"' in normalizer)
    return n
