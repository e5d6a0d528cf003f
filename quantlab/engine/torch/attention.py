"""The engines' attention: grouped-query matmuls for decode rows, and for a prompt query rows in chunks.

Registered with transformers as ``quantlab`` (``AttentionInterface`` and its mask), so either engine sets it by
name. A decode step (at most ``DECODE_ROWS`` query rows) multiplies each key/value head's group of query heads
at once: the keys and values are read once per step instead of once per query head, and nothing is copied
(``repeat_kv`` and SDPA's CPU kernel, whose setup cost grows with the cached positions, are both avoided; at
2,048 positions the eager engine's step fell from 43 to 19 ms on SmolLM2-135M). A static layer that reads its own codes
attends for a decode row under either name (``kv/code_attention.py``: the stored bytes read once in C; the forward
passes its cache as ``quantlab_cache``, and ``mark_code_attention`` tells the layers, which then skip building the
keys and values nobody reads). ``quantlab-fused`` (for a cache whose keys and values are computed from codes)
otherwise writes the products under ``torch.compile`` as broadcast multiply-and-sum, so
inductor fuses the dequantization into the attention's loops. A prompt on the CPU (``chunked_attention``) takes
``PREFILL_CHUNK_ROWS`` query rows at a time, each chunk's float32 scores over only the keys its rows see (causal, a
sliding window's, a static cache's filled slots), the probabilities times the values in the values' dtype; its error
against a float32 reference is 0.011-0.020 where PyTorch's CPU flash kernel's is 0.008-0.012 (bf16; the kernel keeps
its probabilities in float32). Against the SDPA forward in whole prefills (``benchmarks/prefill_attention.py``,
2-core VM, compiled engine, native cache): Gemma 3 270M Q4_K_M 0.99x at 128 tokens, 0.78x at 512, 0.55x at 2,048,
0.38x at 4,096 (five of its six layers see a 512-key window); SmolLM2-135M Q4_0 0.98x, 0.87x, 0.95x. Over
``SDPA_CAUSAL_ROWS`` mask-free rows with heads under 128 wide the flash kernel stays (its bf16 products outrun the
chunks' float32 scores: 160 against 181 ms a SmolLM2 layer at 4,096). Softcapped scores, compiled graphs and other
devices go to SDPA.
"""
from __future__ import annotations

import torch

from ...kv import code_attention

NAME = "quantlab"
FUSED_NAME = "quantlab-fused"  # decode rows as multiply-and-sum when compiled: for keys a cache computes
DECODE_ROWS = 16
PREFILL_CHUNK_ROWS = 128  # query rows a prompt's chunk scores at once (64-256 within 10% at 128-4,096 tokens)
SDPA_CAUSAL_ROWS = 2048  # a mask-free prompt longer than this with heads under 128 wide: SDPA's flash kernel is faster
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
    if (q > DECODE_ROWS and softcap is None and query.device.type == "cpu" and not torch.compiler.is_compiling()
            and (attention_mask is not None or q <= SDPA_CAUSAL_ROWS or d >= 128)):
        return chunked_attention(query, key, value, attention_mask, scaling if scaling is not None else d ** -0.5), None
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
        scores = _mask_scores(scores, attention_mask[..., :t])
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


def _mask_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``scores [b, hkv, g, q, t]`` (float32) plus transformers' boolean or additive ``mask [b, 1 or h, q, t]``,
    made additive float32 once for all heads (a boolean ``masked_fill_`` broadcast over the heads is 10x slower)."""
    add = (torch.zeros((), dtype=scores.dtype, device=scores.device).masked_fill(~mask, float("-inf"))
           if mask.dtype == torch.bool else mask.to(scores.dtype))
    return scores.add_(add[:, :, None] if add.shape[1] == 1 else add.reshape(*scores.shape[:3], *add.shape[2:]))


def _visible_keys(mask: torch.Tensor) -> tuple[int, int]:
    """The span of key positions some row of ``mask [..., rows, t]`` (boolean, or additive with transformers'
    dtype minimum where masked) sees: a chunk's scores need no column outside it."""
    seen = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    columns = seen.reshape(-1, seen.shape[-1]).any(0).nonzero()
    return (0, mask.shape[-1]) if len(columns) == 0 else (int(columns[0]), int(columns[-1]) + 1)


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float) -> torch.Tensor:
    """A prompt's attention, ``query [b, hq, q, d]`` over ``key``/``value [b, hkv, t, d]`` -> ``[b, q, hq, d]``:
    ``PREFILL_CHUNK_ROWS`` query rows at a time, each key/value head's group of query heads in one matmul, float32
    scores over only the keys the chunk's rows see (the mask's span: causal, a sliding window, a static cache's
    empty slots; ``attention_mask`` None: causal, row i seeing keys up to i as SDPA's ``is_causal``), the softmax's
    probabilities times the values in the values' dtype."""
    b, hq, q, d = query.shape
    hkv, t = key.shape[1], key.shape[2]
    g = hq // hkv
    queries = (query.float() * scaling).view(b, hkv, g, q, d)
    keys = key.float()
    out = torch.empty(b, q, hq, d, dtype=value.dtype, device=query.device)
    for r0 in range(0, q, PREFILL_CHUNK_ROWS):
        r1 = min(q, r0 + PREFILL_CHUNK_ROWS)
        rows = r1 - r0
        mask = None if attention_mask is None else attention_mask[:, :, r0:r1, :t]
        start, end = (0, min(r1, t)) if mask is None else _visible_keys(mask)
        scores = torch.matmul(queries[:, :, :, r0:r1].reshape(b, hkv, g * rows, d),
                              keys[:, :, start:end].transpose(2, 3)).view(b, hkv, g, rows, end - start)
        if mask is not None:
            scores = _mask_scores(scores, mask[..., start:end])
        else:  # row i of the chunk (query r0 + i) sees keys 0 .. r0 + i: only the last rows x rows block is masked
            scores[..., end - rows:].add_(torch.full((rows, rows), float("-inf"), device=query.device).triu(1))
        probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, hkv, g * rows, end - start)
        out[:, r0:r1] = torch.matmul(probs, value[:, :, start:end]).view(b, hq, rows, d).transpose(1, 2)
    return out


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
