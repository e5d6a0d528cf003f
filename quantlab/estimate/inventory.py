"""The model's tensors by component, without weights: from transformers' own modules on the meta device,
or, for an architecture transformers does not know, from a decoder formula whose assumptions are listed."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .evidence import Architecture

COMPONENTS = ("embeddings", "attention", "mlp", "norms", "head", "other")


@dataclass
class TensorEntry:
    component: str
    name: str
    shape: tuple[int, ...]  # linear weights as [out, in]
    quantizable: bool  # selected by quantize_'s default policy (a decoder linear weight)
    head: bool = False  # the output head's weight (also the embedding's, when tied)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Inventory:
    tensors: list[TensorEntry]
    source: str  # how the tensors were established
    projections: dict[str, tuple[int, int]] = field(default_factory=dict)  # first layer: name -> (in, out)
    assumptions: list[str] = field(default_factory=list)
    buffers: list[tuple[str, int, torch.dtype]] = field(default_factory=list)  # non-parameter tensors: name, numel, dtype
    mlp_kind: tuple[str, str, str] | None = None  # (value, source kind, where) for the evidence table
    head_module: str | None = None  # the output head's module name (what an override's globs match)

    def params_by_component(self) -> dict[str, int]:
        out = dict.fromkeys(COMPONENTS, 0)
        for t in self.tensors:
            out[t.component] += t.numel
        return out

    @property
    def param_count(self) -> int:
        return sum(t.numel for t in self.tensors)


def _component(name: str, module: nn.Module, model: nn.Module) -> str:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if module is head:
        return "head"
    if isinstance(module, nn.Embedding):
        return "embeddings"
    if "norm" in type(module).__name__.lower() or name.rsplit(".", 1)[-1].endswith(("norm", "ln_1", "ln_2", "ln_f")):
        return "norms"
    parts = name.lower().split(".")
    if any("attn" in p or "attention" in p for p in parts):
        return "attention"
    if any(p in ("mlp", "feed_forward", "ffn") for p in parts):
        return "mlp"
    return "other"


def from_implementation(config: Any) -> Inventory:
    """Instantiate the transformers model on the meta device (no memory, no weights) and list its tensors;
    tied tensors are listed once."""
    from ..models import meta_model
    from ..quant.apply import default_exclude, select_linears
    from ..quant.linear import linear_types, linear_weight

    model = meta_model(config)
    selected = set(select_linears(model)[0])
    head_module = next(iter(default_exclude(model)), None)
    head_weight = getattr(model.get_submodule(head_module), "weight", None) if head_module else None
    seen: set[int] = set()
    tensors: list[TensorEntry] = []
    projections: dict[str, tuple[int, int]] = {}
    buffers: list[tuple[str, int, torch.dtype]] = []
    for name, module in model.named_modules():
        component = _component(name, module, model)
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            is_weight = isinstance(module, linear_types()) and pname == "weight"
            shape = tuple(linear_weight(module).shape) if is_weight else tuple(p.shape)  # linears as [out, in]
            tensors.append(TensorEntry(component, f"{name}.{pname}", shape, is_weight and name in selected,
                                       head=p is head_weight))
        for bname, b in module.named_buffers(recurse=False):
            if b is not None and id(b) not in seen:
                seen.add(id(b))
                buffers.append((f"{name}.{bname}", b.numel(), b.dtype))
        inside = _inside_first_layer(name)
        if isinstance(module, linear_types()) and inside:
            out, n_in = linear_weight(module).shape
            projections[inside] = (int(n_in), int(out))
    return Inventory(tensors, f"transformers {type(model).__name__} instantiated on the meta device", projections,
                     buffers=buffers, mlp_kind=_mlp_kind(model), head_module=head_module)


GATE_NAMES = ("gate_proj", "gate_up_proj", "w1", "w3", "fc_gate")


def _mlp_kind(model: nn.Module) -> tuple[str, str, str] | None:
    """Gated or not, read off the first layer's MLP module and its projections."""
    from ..quant.linear import linear_types

    for name, module in model.named_modules():
        inside = _inside_first_layer(name)
        if inside not in ("mlp", "feed_forward", "ffn"):
            continue
        projections = [n for n, m in module.named_children() if isinstance(m, linear_types())]
        gated = any(n in GATE_NAMES for n in projections)
        value = ("gated" if gated else "not gated") + f" ({', '.join(projections)})"
        return value, "implementation", f"transformers {type(module).__name__}"
    return None


def _inside_first_layer(name: str) -> str | None:
    """``self_attn.q_proj`` for ``model.layers.0.self_attn.q_proj``; None outside the first layer."""
    parts = name.split(".")
    for i in range(1, len(parts) - 1):
        if parts[i] == "0" and parts[i - 1] in ("layers", "h", "blocks", "layer"):
            return ".".join(parts[i + 1:])
    return None


FORMULA_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "vocab_size", "intermediate_size", "tie_word_embeddings")


def from_formula(arch: Architecture) -> Inventory | None:
    """A Llama-style decoder from the evidence (None if a needed fact is missing)."""
    if any(getattr(arch, f) is None for f in FORMULA_FIELDS):
        return None
    d, L, hq, hkv, dh = arch.hidden_size, arch.num_hidden_layers, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    ff, vocab = arch.intermediate_size, arch.vocab_size
    assert d and L and hq and hkv and dh and ff and vocab  # narrowed by the check above
    layer = [("attention", "q_proj", (hq * dh, d)), ("attention", "k_proj", (hkv * dh, d)),
             ("attention", "v_proj", (hkv * dh, d)), ("attention", "o_proj", (d, hq * dh)),
             ("mlp", "gate_proj", (ff, d)), ("mlp", "up_proj", (ff, d)), ("mlp", "down_proj", (d, ff))]
    tied = bool(arch.tie_word_embeddings)
    tensors = [TensorEntry("embeddings", "embed_tokens.weight", (vocab, d), False, head=tied)]
    for i in range(L):
        tensors += [TensorEntry(c, f"layers.{i}.{n}.weight", s, True) for c, n, s in layer]
        tensors += [TensorEntry("norms", f"layers.{i}.{n}.weight", (d,), False) for n in ("input_norm", "post_attention_norm")]
    tensors.append(TensorEntry("norms", "norm.weight", (d,), False))
    if not tied:
        tensors.append(TensorEntry("head", "lm_head.weight", (vocab, d), False, head=True))
    projections = {n: (s[1], s[0]) for _, n, s in layer}
    return Inventory(tensors, "Llama-style decoder formula (transformers does not know this architecture)", projections,
                     mlp_kind=("gated (gate_proj, up_proj, down_proj)", "assumption", "Llama-style decoder formula"),
                     head_module="lm_head",
                     assumptions=["gated MLP (gate, up, down projections)", "no biases", "two weight-only norms per layer and one final",
                      "no position-embedding table (rotary positions)"])
