"""Read a model configuration into an evidence table: each architectural fact, its value and where it comes from.

Sources, kept apart as the config-reading discipline asks: ``file`` (a field of the
config file), ``implementation`` (a default or rule of the transformers code for
that architecture, named), ``derived`` (arithmetic on other rows) and ``assumption``.
A fact that none of these establishes is listed as not interpreted, never guessed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import QuantlabError

FILE, IMPLEMENTATION, DERIVED, ASSUMPTION = "file", "implementation", "derived", "assumption"

# Field names other model families use for the same meaning (read only for architectures transformers does not know).
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim", "model_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_head_kv", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "kv_channels", "attention_head_dim"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx"),
    "vocab_size": ("vocab_size", "n_vocab", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", "d_ff"),
    "tie_word_embeddings": ("tie_word_embeddings",),
}
MEANINGS = {
    "hidden_size": "residual width", "num_hidden_layers": "layers", "num_attention_heads": "query heads",
    "num_key_value_heads": "KV heads", "head_dim": "head width", "max_position_embeddings": "position limit",
    "vocab_size": "vocabulary", "intermediate_size": "MLP width", "tie_word_embeddings": "tied embeddings",
}
# Architectures whose transformers attention has one key/value head per query head (no grouped-query field).
ONE_KV_HEAD_PER_QUERY_HEAD = {"gpt2", "gpt_neo", "gptj", "opt", "bloom", "codegen"}
# Architectures whose MLP width, when absent, is 4 x the residual width in the transformers implementation.
FOUR_TIMES_WIDTH_MLP = {"gpt2": "GPT2MLP: inner_dim = n_inner or 4 * n_embd", "codegen": "CodeGenMLP: n_inner or 4 * n_embd"}


@dataclass
class Evidence:
    meaning: str
    value: Any
    kind: str  # file | implementation | derived | assumption
    source: str


@dataclass
class Architecture:
    """The facts an estimate needs, each None where nothing establishes it."""

    model_type: str | None
    config_class: str | None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    tie_word_embeddings: bool | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    dtype: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    not_interpreted: list[str] = field(default_factory=list)

    def row(self, meaning: str) -> Evidence | None:
        return next((e for e in self.evidence if e.meaning == meaning), None)


def read_raw_config(source: str) -> tuple[dict[str, Any], str]:
    """The config file's fields as written, and where they were read: a ``config.json`` path, a model
    folder holding one, or a hub id (needs the hub)."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise QuantlabError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(raw, dict):
            raise QuantlabError(f"{path}: a model config is a JSON object, got {type(raw).__name__}")
        return raw, str(path)
    if path.suffix == ".json" or path.exists() or source.count("/") != 1:
        raise QuantlabError(f"{source}: no such config file or model folder (give a config.json, a folder, or a hub id)")
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(source, "config.json")).read_text()), f"hub:{source}/config.json"
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: all one message
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise QuantlabError(f"{source}: cannot fetch config.json from the hub ({first})") from None


def config_object(raw: dict[str, Any]) -> Any | None:
    """transformers' config class for the file's ``model_type``, built from the file (None if unknown)."""
    from transformers import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    cls = CONFIG_MAPPING[model_type]
    try:
        config = cls(**{k: v for k, v in raw.items() if k != "model_type"})
    except (TypeError, ValueError) as e:
        raise QuantlabError(f"config {model_type}: transformers' {cls.__name__} refuses it: {e}") from None
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class _Reader:
    def __init__(self, raw: dict[str, Any], config: Any | None) -> None:
        self.raw, self.config = raw, config
        self.cls = type(config).__name__ if config is not None else None
        self.attribute_map = dict(getattr(type(config), "attribute_map", {}) or {}) if config is not None else {}

    def file_field(self, attr: str) -> tuple[str, Any] | None:
        names = (self.attribute_map.get(attr, attr),) if self.config is not None else ALIASES.get(attr, (attr,))
        for name in names:
            if self.raw.get(name) is not None:
                return name, self.raw[name]
        return None

    def fact(self, attr: str) -> Evidence | None:
        meaning = MEANINGS[attr]
        found = self.file_field(attr)
        if found is not None:
            name, value = found
            return Evidence(meaning, value, FILE, name)
        value = getattr(self.config, attr, None) if self.config is not None else None
        if value is not None:
            return Evidence(meaning, value, IMPLEMENTATION, f"transformers {self.cls} sets {attr} = {value} when the file omits it")
        return None


def _pattern(types: list[str]) -> str:
    """'5 local : 1 global' for a periodic interleave, else counts."""
    for period in range(2, len(types) // 2 + 1):
        if all(types[i] == types[i % period] for i in range(len(types))):
            unit = types[:period]
            local = sum(t == "sliding_attention" for t in unit)
            return f"{local} local : {period - local} global, repeating"
    return "irregular"


def _attention_pattern(arch: Architecture, reader: _Reader) -> None:
    raw, config = reader.raw, reader.config
    layers = arch.num_hidden_layers
    window_field = reader.file_field("sliding_window") if config is not None else (
        ("sliding_window", raw["sliding_window"]) if raw.get("sliding_window") else None)
    window = getattr(config, "sliding_window", None) if config is not None else (window_field[1] if window_field else None)
    types = getattr(config, "layer_types", None) if config is not None else raw.get("layer_types")
    if types and "layer_types" in raw:
        kind, source = FILE, "layer_types"
    elif types:
        rule = next((f"{k}={raw[k]}" for k in ("sliding_window_pattern", "use_sliding_window", "max_window_layers") if k in raw), "")
        kind, source = IMPLEMENTATION, f"transformers {reader.cls} derives layer_types" + (f" from {rule}" if rule else "")
    elif layers and window and config is not None:
        types = ["sliding_attention"] * layers
        kind, source = IMPLEMENTATION, ("no layer_types: transformers' attention and caches treat every layer as "
                                        f"sliding when sliding_window is set ({reader.cls})")
    elif layers and config is not None:
        types = ["full_attention"] * layers
        has = hasattr(config, "sliding_window")
        kind, source = IMPLEMENTATION, (f"transformers {reader.cls}: sliding_window is null, every layer global" if has
                                        else f"transformers {reader.cls} has no sliding window: every layer global")
    elif layers and "sliding_window" not in raw and "layer_types" not in raw:
        arch.not_interpreted.append("attention pattern (no layer_types or sliding_window, and no implementation to ask)")
        return
    else:
        arch.not_interpreted.append("attention pattern")
        return
    arch.layer_types = list(types)
    sliding = sum(t == "sliding_attention" for t in types)
    other = [t for t in set(types) if t not in ("sliding_attention", "full_attention")]
    if other:
        arch.not_interpreted.append(f"layer types {sorted(other)} (only sliding and full attention are estimated)")
    if sliding:
        arch.sliding_window = window
        src = (FILE, window_field[0]) if window_field else (IMPLEMENTATION, f"transformers {reader.cls} default")
        arch.evidence.append(Evidence("sliding window", window, *src))
    if sliding == 0:
        value = f"global in all {len(types)} layers"
    elif sliding == len(types):
        value = f"sliding window {window} in all {len(types)} layers"
    else:
        value = f"{sliding} sliding (window {window}) and {len(types) - sliding} global layers: {_pattern(types)}"
    arch.evidence.append(Evidence("attention pattern", value, kind, source))


_UNSET: Any = object()


def read_architecture(raw: dict[str, Any], config: Any = _UNSET) -> Architecture:
    """The evidence table for a config file's fields, with transformers' defaults and rules where it knows
    the architecture; facts nothing establishes go to ``not_interpreted``. ``config``: the file's
    ``config_object``, when the caller has built it already."""
    if config is _UNSET:
        config = config_object(raw)
    reader = _Reader(raw, config)
    model_type = raw.get("model_type") if isinstance(raw.get("model_type"), str) else None
    arch = Architecture(model_type=model_type, config_class=reader.cls)
    if config is None:
        arch.evidence.append(Evidence("architecture", model_type or "(no model_type)", ASSUMPTION,
                                      "transformers does not know this model_type: only the file's fields are read, "
                                      "under common names"))
    for attr in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        _take(arch, attr, reader.fact(attr))
    kv = reader.fact("num_key_value_heads")
    if kv is None and model_type in ONE_KV_HEAD_PER_QUERY_HEAD and arch.num_attention_heads and config is not None:
        kv = Evidence(MEANINGS["num_key_value_heads"], arch.num_attention_heads, IMPLEMENTATION,
                      f"transformers {model_type} attention has one key/value head per query head")
    _take(arch, "num_key_value_heads", kv)
    head = reader.fact("head_dim")
    if head is None and config is not None and arch.hidden_size and arch.num_attention_heads:
        head = Evidence(MEANINGS["head_dim"], arch.hidden_size // arch.num_attention_heads, IMPLEMENTATION,
                        f"transformers {model_type} attention: hidden_size / num_attention_heads = "
                        f"{arch.hidden_size} / {arch.num_attention_heads}")
    _take(arch, "head_dim", head)
    for attr in ("max_position_embeddings", "vocab_size"):
        _take(arch, attr, reader.fact(attr))
    mlp = reader.fact("intermediate_size")
    if mlp is None and model_type in FOUR_TIMES_WIDTH_MLP and arch.hidden_size:
        mlp = Evidence(MEANINGS["intermediate_size"], 4 * arch.hidden_size, IMPLEMENTATION,
                       f"transformers {FOUR_TIMES_WIDTH_MLP[model_type]} = 4 * {arch.hidden_size}")
    _take(arch, "intermediate_size", mlp)
    tied = reader.fact("tie_word_embeddings")
    if tied is None and config is not None:
        tied = Evidence(MEANINGS["tie_word_embeddings"], bool(getattr(config, "tie_word_embeddings", False)),
                        IMPLEMENTATION, f"transformers {reader.cls} default")
    _take(arch, "tie_word_embeddings", tied)
    _attention_pattern(arch, reader)
    dtype = raw.get("torch_dtype") or raw.get("dtype")
    if dtype:
        arch.dtype = str(dtype)
        arch.evidence.append(Evidence("stored dtype", arch.dtype, FILE, "torch_dtype" if raw.get("torch_dtype") else "dtype"))
    return arch


def _take(arch: Architecture, attr: str, evidence: Evidence | None) -> None:
    if evidence is None:
        names = ", ".join(ALIASES.get(attr, (attr,)))
        arch.not_interpreted.append(f"{MEANINGS[attr]} (looked for {names})")
        return
    setattr(arch, attr, evidence.value)
    arch.evidence.append(evidence)
