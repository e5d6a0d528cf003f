"""llama.cpp's named mixes (``llama-quantize``'s file types: Q4_K_M, Q3_K_M, Q5_K_S …) as a per-tensor type choice.

A mix has a default ggml type and rules that give some tensors another by their role and layer: the attention
value projection and the feed-forward down projection take more bits in the first and last eighth of the layers
and every third one between (``use_more_bits``), the output matrix takes Q6_K, and so on. This is the rule set
of llama.cpp's ``llama_tensor_get_type`` for dense models (no experts) and these file types, followed by its
substitute for rows that are not whole blocks of the chosen type. Tensors are named by llama.cpp's categories;
``category`` reads them from a transformers module name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..forms.ggml.tensor import GGML_TYPES, row_type

# file type -> its default ggml type
RECIPES: dict[str, str] = {
    "Q2_K": "Q2_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K", "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1",
    "Q5_0": "Q5_0", "Q5_1": "Q5_1", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS",
}
# transformers module name endings -> llama.cpp's tensor category
CATEGORIES = (
    ("lm_head", "output"), ("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
    ("o_proj", "attn_output"), ("attn.c_attn", "attn_qkv"), ("attn.c_proj", "attn_output"),
    ("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down"), ("mlp.c_fc", "ffn_up"),
    ("mlp.c_proj", "ffn_down"),
)
ATTN_V_LIKE = ("attn_v", "attn_qkv")  # llama.cpp's category_is_attn_v


@dataclass(frozen=True)
class TensorRole:
    """A weight as llama.cpp's rules see it: its category, its layer (None outside the layers), its row length."""

    name: str
    category: str
    layer: int | None
    n_in: int


def category(module: str, head: str | None = None) -> str:
    """llama.cpp's category of the linear ``module`` (``other`` where it has none)."""
    if head is not None and module == head:
        return "output"
    return next((cat for suffix, cat in CATEGORIES if module.endswith(suffix)), "other")


def layer_of(module: str) -> int | None:
    found = re.search(r"\.(\d+)\.", module)
    return int(found.group(1)) if found else None


def heads_per_kv_head(linears: dict[str, tuple[int, int]]) -> int:
    """Query heads per key/value head (llama.cpp's n_gqa), from the first q and v projection's rows (1 where the
    model has no separate ones)."""
    q = next((o for n, (o, _) in linears.items() if category(n) == "attn_q"), None)
    v = next((o for n, (o, _) in linears.items() if category(n) == "attn_v"), None)
    return max(1, q // v) if q and v else 1


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def recipe_types(recipe: str, roles: list[TensorRole], n_gqa: int, has_imatrix: bool = False) -> dict[str, str]:
    """The ggml type llama.cpp's quantizer writes for each tensor under the file type ``recipe``. Counts per
    category run in layer order, as llama.cpp's counters do over a file written layer by layer."""
    default = RECIPES[recipe]
    n_attn_v = sum(r.category in ATTN_V_LIKE for r in roles)
    n_ffn_down = sum(r.category == "ffn_down" for r in roles)
    seen_v = 0
    types: dict[str, str] = {}
    for role in sorted(roles, key=lambda r: (r.layer if r.layer is not None else -1, r.name)):
        kind, cat = default, role.category
        if cat == "output":
            kind = "Q8_0" if role.n_in % GGML_TYPES[default].block else default if default == "Q8_0" else "Q6_K"
        elif cat in ATTN_V_LIKE:
            kind = _attn_v(recipe, default, seen_v, n_attn_v, n_gqa)
            seen_v += 1
        elif cat == "ffn_down":
            kind = _ffn_down(recipe, default, role.layer or 0, n_ffn_down, has_imatrix)
        elif cat == "attn_output":
            kind = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(recipe, default)
        types[role.name] = row_type(kind, role.n_in)
    return types


def _attn_v(recipe: str, default: str, i: int, n: int, n_gqa: int) -> str:
    if recipe == "Q2_K":
        return "Q4_K" if n_gqa >= 4 else "Q3_K"
    if recipe == "Q3_K_M":
        return "Q5_K" if i < 2 else "Q4_K"
    if recipe == "Q3_K_L":
        return "Q5_K"
    if recipe in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
        return "Q5_K"
    if recipe in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
        return "Q6_K"
    if recipe == "Q4_K_S" and i < 4:
        return "Q5_K"
    return default


def _ffn_down(recipe: str, default: str, i: int, n: int, has_imatrix: bool) -> str:
    if recipe == "Q2_K":
        return "Q3_K"
    if recipe == "Q3_K_M":
        return "Q5_K" if i < n // 16 else "Q4_K"
    if recipe == "Q3_K_L":
        return "Q5_K"
    if recipe == "Q4_K_M":
        return "Q6_K" if use_more_bits(i, n) else default
    if i < n // 8 and recipe in ("IQ4_NL", "IQ4_XS") and not has_imatrix:
        return "Q5_K"
    if recipe == "Q5_K_M" and use_more_bits(i, n):
        return "Q6_K"
    if recipe == "Q4_K_S" and i < n // 8:
        return "Q5_K"
    if recipe in ("Q4_0", "Q5_0") and has_imatrix and i < n // 8:
        return "Q4_1" if recipe == "Q4_0" else "Q5_1"
    return default
