"""The engines' attention: grouped-query matmuls for decode rows, PyTorch's fused SDPA for long inputs.

Registered with transformers as ``quantlab`` (``AttentionInterface`` and its mask), so either engine sets it by
name. A decode step (at most ``DECODE_ROWS`` query rows) multiplies each key/value head's group of query heads
at once: the keys and values are read once per step instead of once per query head, and nothing is copied
(``repeat_kv`` and SDPA's CPU kernel, whose setup cost grows with the cached positions, are both avoided; at
2,048 positions the eager engine's step fell from 43 to 19 ms on SmolLM2-135M). A static layer that reads its own codes
attends for a decode row under either name (``kv/code_attention.py``: the stored bytes read once in C; the forward
passes its cache as ``quantlab_cache``, and ``mark_code_attention`` tells the layers, which then skip building the
keys and values nobody reads). ``quantlab-fused`` (for a cache whose keys and values are computed from codes)
otherwise writes the products under ``torch.compile`` as broadcast multiply-and-sum, so
inductor fuses the dequantization into the attention's loops. Longer inputs (a prefill) go to SDPA, causal where transformers skips the
mask, which is 3x faster than the plain matmuls at 2,048 tokens.
"""
from __future__ import annotations

import torch

from ...kv import code_attention

NAME = "quantlab"
FUSED_NAME = "quantlab-fused"  # decode rows as multiply-and-sum when compiled: for keys a cache computes
DECODE_ROWS = 16
CACHE_KWARG = "quantlab_cache"  # the forward's cache, passed down to the attention: layers that read their codes


def _code_layer(module: torch.nn.Module, kwargs: dict[str, object]) -> object | None:
    """The cache layer of ``module`` when it attends over its stored codes itself (``kv/code_attention.py``)."""
    cache, index = kwargs.get(CACHE_KWARG), getattr(module, "layer_idx", None)
    if cache is None or index is None:
        return None
    layer = cache.layers[index]  # type: ignore[attr-defined]
    return layer if getattr(layer, "reads_codes", False) else None


def mark_code_attention(model: torch.nn.Module, cache: object) -> None:
    """Tell ``cache``'s layers that read their codes whether the model's attention in effect is quantlab's (which
    then attends over the stores itself for a decode row, so the layer skips building keys and values)."""
    ours = getattr(model.config, "_attn_implementation", None) in (NAME, FUSED_NAME)
    for layer in getattr(cache, "layers", ()):
        if hasattr(layer, "reads_codes"):
            layer.codes_attended = ours


def _scores_fused(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``[b, hkv, g, q, t]`` scores as one reduction over the head dimension (fuses with key producers)."""
    return (query.unsqueeze(-2).float() * key[:, :, None, None].float()).sum(-1)


def grouped_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      softcap: float | None = None, fuse: bool = False, **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query [b, hq, q, d]``, ``key``/``value [b, hkv, t, d]``; returns
    ``[b, q, hq, d]``. ``attention_mask``: the additive or boolean mask transformers built (None: causal for a
    prefill, every key for a decode row). ``fuse``: under ``torch.compile``, decode rows as multiply-and-sum
    (fusing a producer of the keys and values, a quantized cache's dequantization; for keys already in memory
    the batched matmuls are faster)."""
    b, hq, q, d = query.shape
    hkv, t = key.shape[1], key.shape[2]
    if q > DECODE_ROWS and softcap is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layer = _code_layer(module, kwargs) if q == 1 else None
    if layer is not None:
        return code_attention.attend(layer, query, attention_mask, scaling if scaling is not None else d ** -0.5, softcap), None
    g = hq // hkv
    grouped = query.reshape(b, hkv, g, q, d)
    fused = fuse and torch.compiler.is_compiling()
    dense = q == 1 and not fused and code_attention.reads_dense(key, value)
    if fused:
        scores = _scores_fused(grouped, key)
    elif dense:
        scores = code_attention.dense_scores(grouped, key)
    else:
        scores = torch.matmul(grouped.reshape(b, hkv, g * q, d), key.transpose(2, 3)).view(b, hkv, g, q, t).float()
    scores = scores * (scaling if scaling is not None else d ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[:, :, None, :, :t]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    elif q > 1:  # transformers skipped the mask: causal as SDPA's is_causal (query row i sees keys 0..i)
        rows = torch.arange(q, device=query.device).unsqueeze(-1)
        scores = scores.masked_fill(torch.arange(t, device=query.device) > rows, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if fused:
        out = (probs.unsqueeze(-1) * value[:, :, None, None].float()).sum(-2).to(value.dtype)
    elif dense:
        out = code_attention.dense_values(probs, value).to(value.dtype)
    else:
        out = torch.matmul(probs.to(value.dtype).reshape(b, hkv, g * q, t), value)
    return out.reshape(b, hq, q, d).transpose(1, 2).contiguous(), None


def fused_grouped_attention(*args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
    return grouped_attention(*args, fuse=True, **kwargs)


def register() -> None:
    """Register ``quantlab`` and ``quantlab-fused`` with transformers' attention and mask interfaces (once), and
    build the C attention kernel a decode row reads a cache through (a compiled graph reads whether it built)."""
    code_attention.available()
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    for name, function in ((NAME, grouped_attention), (FUSED_NAME, fused_grouped_attention)):
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, function)
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
