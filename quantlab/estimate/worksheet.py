"""The memory worksheet: parameters by component, weight payload per weight format, KV cache per KV format.

Every figure comes from the config (evidence table), transformers' modules on the
meta device and each format's own byte formula; nothing is loaded or measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..dtypes import DTYPES
from ..errors import QuantlabError
from ..kv.format import KVFormat
from ..quant.format import WeightFormat
from .evidence import ASSUMPTION, Architecture, Evidence, config_object, read_architecture, read_raw_config
from .inventory import Inventory, from_formula, from_implementation

GB, GIB = 10**9, 2**30


@dataclass
class WeightPayload:
    label: str
    bytes: int
    quantized_params: int
    quantized_bytes: int
    unquantized_dtype: str

    @property
    def bits_per_quantized_weight(self) -> float | None:
        return 8 * self.quantized_bytes / self.quantized_params if self.quantized_params else None


@dataclass
class KVPayload:
    label: str
    bytes_full: int | None  # every layer stores every position
    bytes_retained: int | None  # sliding-window layers keep only their window
    note: str = ""


@dataclass
class Estimate:
    source: str
    architecture: Architecture
    inventory: Inventory | None
    dtype: str
    batch_size: int
    seq_len_tokens: int
    weights: list[WeightPayload] = field(default_factory=list)
    kv: list[KVPayload] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def param_count(self) -> int | None:
        return self.inventory.param_count if self.inventory else None

    def beyond_position_limit(self) -> str | None:
        """Why the stored positions exceed what the config allows, or None."""
        limit = self.architecture.max_position_embeddings
        if limit is None or self.seq_len_tokens <= limit:
            return None
        fact = self.architecture.row("position limit")
        where = f" ({fact.kind}: {fact.source})" if fact else ""
        return (f"{self.seq_len_tokens:,} positions exceed the position limit max_position_embeddings = {limit:,}{where}; "
                "the model was not trained for them and may refuse them")

    def kv_formula(self) -> str | None:
        """The full and retained payload formula with this model's numbers, for one element size."""
        a = self.architecture
        if None in (a.num_key_value_heads, a.head_dim, a.layer_types):
            return None
        assert a.layer_types is not None
        b = DTYPES.get(self.dtype, torch.float32).itemsize
        per = 2 * self.batch_size * a.num_key_value_heads * a.head_dim * b  # type: ignore[operator]
        n_local = sum(t == "sliding_attention" for t in a.layer_types)
        n_global = len(a.layer_types) - n_local
        s, w = self.seq_len_tokens, a.sliding_window or 0
        full = f"M_full = 2·B·L·S·h_kv·d_h·b = 2·{self.batch_size}·{len(a.layer_types)}·{s}·{a.num_key_value_heads}·{a.head_dim}·{b} = {per * len(a.layer_types) * s:,} B"
        if not n_local:
            return full
        retained = per * (n_global * s + n_local * min(s, w))
        return (f"{full}\nM_retained = 2·B·h_kv·d_h·b·[L_g·S + L_l·min(S, w)] = {per:,}·[{n_global}·{s} + {n_local}·{min(s, w)}]"
                f" = {retained:,} B")

    def beside_measured(self, weight_format: WeightFormat, kv_format: KVFormat,
                        points: list[tuple[int, int]]) -> dict[str, Any]:
        """What the config alone predicts for one variant: weight bytes, and KV bytes at each (batch, positions).
        Built once per model, it serves every variant of a run."""
        base = DTYPES[self.dtype]
        try:
            weights = weight_payload(self.inventory, weight_format, base).bytes if self.inventory else None
        except NotImplementedError:
            weights = None
        compute = weight_format.unquantized_dtype(base)  # a cast format changes the cache's dtype too
        kv = [kv_payload(self.architecture, kv_format, batch, tokens, compute).bytes_retained for batch, tokens in points]
        return {"weight_bytes_estimate": weights, "kv_cache_bytes_estimate": kv,
                "estimate_params_source": self.inventory.source if self.inventory else None}

    def to_dict(self) -> dict[str, Any]:
        a = self.architecture
        inv = self.inventory
        return {
            "source": self.source, "model_type": a.model_type, "config_class": a.config_class,
            "evidence": [vars(e) for e in a.evidence], "not_interpreted": a.not_interpreted,
            "param_count": self.param_count,
            "params_by_component": inv.params_by_component() if inv else None,
            "params_source": inv.source if inv else None,
            "projections": {k: {"in": i, "out": o} for k, (i, o) in inv.projections.items()} if inv else None,
            "dtype": self.dtype, "batch_size": self.batch_size, "seq_len_tokens": self.seq_len_tokens,
            "notes": [n for n in [self.beyond_position_limit()] if n],
            "weight_bytes": {w.label: w.bytes for w in self.weights},
            "weight_formats": [{**vars(w), "bits_per_quantized_weight": w.bits_per_quantized_weight} for w in self.weights],
            "kv_cache_bytes_full": {k.label: k.bytes_full for k in self.kv},
            "kv_cache_bytes_retained": {k.label: k.bytes_retained for k in self.kv},
            "kv_formula": self.kv_formula(),
            "assumptions": self.assumptions,
        }


def weight_payload(inventory: Inventory, fmt: WeightFormat, base: torch.dtype) -> WeightPayload:
    """Bytes of every tensor under ``fmt``: selected linear weights in the layout of the format each is given
    (overrides included; an override naming the output head quantizes it, and a tied embedding table then stays
    beside it, unless the head's format holds the lookup table: ggml blocks), an untied embedding table in the
    format's ``embedding_format`` where it has one, the rest in the unquantized dtype."""
    keep = fmt.unquantized_dtype(base)
    head = fmt.head_format(inventory.head_module) if inventory.head_module else None
    table_format = fmt.embedding_format
    total = quantized_params = quantized_bytes = 0
    by_format: dict[int, tuple[WeightFormat, dict[str, tuple[int, int]]]] = {}
    for t in inventory.tensors:
        module_format = fmt.format_for(t.name.rsplit(".", 1)[0]) if t.quantizable else head if t.head else None
        if module_format is not None and t.head and t.component == "embeddings" and \
                not module_format.head_holds_lookup_table:
            total += t.numel * keep.itemsize  # tied: the table stays for the lookup, the head gets its own copy
        if module_format is None and table_format is not None and t.component == "embeddings" and not t.head:
            b = table_format.linear_weight_bytes(t.shape[0], t.shape[1], base)  # an untied table in blocks
            quantized_params, quantized_bytes, total = quantized_params + t.numel, quantized_bytes + b, total + b
            continue
        if module_format is not None:
            module = t.name.rsplit(".", 1)[0] if t.quantizable else inventory.head_module
            by_format.setdefault(id(module_format), (module_format, {}))[1][module] = (t.shape[0], t.shape[1])
            quantized_params += t.numel
        else:
            total += t.numel * keep.itemsize
    for module_format, linears in by_format.values():  # each format's linears at once: a named mix reads their roles
        b = module_format.linear_weights_bytes(linears, base)
        quantized_bytes += b
        total += b
    for name, numel, dtype in inventory.buffers:  # e.g. an embedding scale, cast with the model
        if not dtype.is_floating_point:
            kept = dtype.itemsize
        elif keep == base and _stays_float32(name):  # loaded in its dtype: transformers keeps these float32
            kept = 4
        else:  # a format that casts the model (model.to) casts every floating buffer
            kept = keep.itemsize
        total += numel * kept
    return WeightPayload(fmt.label, total, quantized_params, quantized_bytes, str(keep).removeprefix("torch."))


def _stays_float32(buffer: str) -> bool:
    """Rotary inverse frequencies stay float32 when transformers loads a model in another dtype (a later
    ``model.to(dtype)`` casts them with the rest)."""
    return buffer.rsplit(".", 1)[-1].endswith("inv_freq")


def normalized_config(arch: Architecture, all_global: bool = False) -> Any:
    """A plain transformers config holding the attention facts, for the KV formats' byte formulas."""
    from transformers import PretrainedConfig

    types = arch.layer_types or []
    if all_global:
        types = ["full_attention"] * len(types)
    return PretrainedConfig(num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
                            num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
                            hidden_size=arch.hidden_size, layer_types=types, sliding_window=arch.sliding_window)


def kv_payload(arch: Architecture, fmt: KVFormat, batch: int, tokens: int, dtype: torch.dtype) -> KVPayload:
    if None in (arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim, arch.layer_types):
        return KVPayload(fmt.label, None, None, "needs layers, KV heads, head width and the attention pattern")
    retained = fmt.cache_bytes_analytic(normalized_config(arch), batch, tokens, dtype)
    full = fmt.cache_bytes_analytic(normalized_config(arch, all_global=True), batch, tokens, dtype)
    note = "" if retained is not None else "the backend decides its layout: measure it"
    return KVPayload(fmt.label, full, retained, note)


def estimate(
    source: str, weight_formats: list[WeightFormat], kv_formats: list[KVFormat], seq_len: int | None = None,
    batch: int = 1, dtype: str | None = None,
) -> Estimate:
    """The evidence table and memory worksheet for a config file, model folder or hub id."""
    raw, where = read_raw_config(source)
    return estimate_from_raw(raw, where, weight_formats, kv_formats, seq_len, batch, dtype)


def estimate_from_raw(
    raw: dict[str, Any], where: str, weight_formats: list[WeightFormat], kv_formats: list[KVFormat],
    seq_len: int | None = None, batch: int = 1, dtype: str | None = None, dtype_source: str = "--dtype",
) -> Estimate:
    """As ``estimate``, from the config's fields; ``seq_len`` defaults to the position limit. ``dtype_source``
    says where a given ``dtype`` came from, for the evidence table."""
    config = config_object(raw)
    arch = read_architecture(raw, config)
    if arch.hidden_size is None and arch.num_hidden_layers is None and arch.num_attention_heads is None:
        raise QuantlabError(f"{where}: no model fields (a hidden size, a layer count, attention heads) under any name "
                            "quantlab reads; is it a model's config.json?")
    if seq_len is None:
        if arch.max_position_embeddings is None:
            raise QuantlabError(f"{where}: no position limit to default to; give --seq-len")
        seq_len = int(arch.max_position_embeddings)
    assumptions = [f"batch {batch} independent sequences of {seq_len:,} stored positions each, no sharing between "
                   "sequences, layers or devices",
                   "payload only: activations, workspace, allocator reserve, CUDA context and alignment are not included",
                   "weights: every decoder linear layer takes the format; embeddings, norms, biases and the output head "
                   "stay unquantized (quantize_'s default)"]
    if dtype is None and arch.dtype is None:
        dtype = "float32"
        arch.evidence.append(Evidence("stored dtype", "float32", ASSUMPTION, "the file names no dtype; pass --dtype"))
    elif dtype is not None and dtype != arch.dtype:
        arch.evidence.append(Evidence("dtype used", dtype, ASSUMPTION, dtype_source))
    dtype = dtype or arch.dtype or "float32"
    if dtype not in DTYPES:
        raise QuantlabError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    inventory = _inventory(config, arch)
    if inventory is not None:
        assumptions += inventory.assumptions
        if inventory.mlp_kind is not None:
            after = next((i + 1 for i, e in enumerate(arch.evidence) if e.meaning == "MLP width"), len(arch.evidence))
            arch.evidence.insert(after, Evidence("MLP kind", *inventory.mlp_kind))
    if arch.layer_types and any(t == "sliding_attention" for t in arch.layer_types):
        assumptions.append("retained: an engine that keeps at most the window in each sliding layer and every position "
                           "in global layers; full: one that allocates every position in every layer and masks")
    base = DTYPES[dtype]
    est = Estimate(where, arch, inventory, dtype, batch, seq_len, assumptions=assumptions)
    if inventory is not None:
        for f in weight_formats:
            try:
                est.weights.append(weight_payload(inventory, f, base))
            except NotImplementedError:
                arch.not_interpreted.append(f"weight payload of {f.label} (the format gives no byte formula)")
    est.kv = [kv_payload(arch, f, batch, seq_len, base) for f in kv_formats]
    return est


def _inventory(config: Any | None, arch: Architecture) -> Inventory | None:
    if config is not None:
        try:
            return from_implementation(config)
        except Exception as e:  # noqa: BLE001 - fall back to the formula, saying why
            arch.not_interpreted.append(f"module tree ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    inventory = from_formula(arch)
    if inventory is None:
        arch.not_interpreted.append("parameter count and weight payload (needs every fact of a Llama-style decoder)")
    return inventory
