"""Protocol ``kv-chunked``: the windows of ``windows``, each fed ``chunk_tokens`` at a time through a fresh cache
of the variant's KV format, so the figure sees what the cache stores."""
from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from ...data import Text
from ...errors import QuantlabError
from ...fidelity.log_probs import nll_sum
from ...progress import progress
from .base import PERPLEXITY_PROTOCOLS, PerplexityProtocol, stamped


@torch.inference_mode()
def cache_perplexity(
    model: nn.Module, ids: torch.Tensor, text: Text, kv: Any, *, window_tokens: int, chunk_tokens: int,
    batch_size: int, device: torch.device,
) -> dict[str, Any]:
    """Protocol ``kv-chunked``: disjoint windows as in ``windows``, each fed ``chunk_tokens`` at a time
    through a fresh cache of KV format ``kv``, so every chunk attends to the stored (quantized) keys and
    values of the chunks before it. Scores the same tokens as ``windows``."""
    n_windows = ids.numel() // window_tokens
    if n_windows == 0:
        raise QuantlabError(f"the text has {ids.numel()} tokens, fewer than one window of {window_tokens}")
    windows = ids[: n_windows * window_tokens].view(n_windows, window_tokens)
    nll, scored = 0.0, 0
    for batch in progress(windows.split(batch_size), "perplexity through the cache, batches"):
        batch = batch.to(device)
        full = logits_through_cache(model, batch, kv, chunk_tokens)[:, :-1]
        nll += nll_sum(full, batch[:, 1:])
        scored += batch[:, 1:].numel()
    return stamped(nll, scored, {"name": "kv-chunked", "window_tokens": window_tokens, "stride_tokens": window_tokens,
                                  "chunk_tokens": chunk_tokens, "kv_format": kv.label}, text)


@torch.inference_mode()
def logits_through_cache(model: nn.Module, batch: torch.Tensor, kv: Any, chunk_tokens: int) -> torch.Tensor:
    """The float32 logits ``[batch, window, vocab]`` of windows ``batch`` (token ids on the model's device) fed
    ``chunk_tokens`` at a time through a fresh cache of KV format ``kv``."""
    from ...kv.hf_compat import cache_kwarg

    arg = cache_kwarg(model)
    cache = kv.make_cache(model.config)
    logits = []
    for start in range(0, batch.shape[1], chunk_tokens):
        chunk = batch[:, start: start + chunk_tokens]
        positions = torch.arange(start, start + chunk.shape[1], device=batch.device)
        logits.append(model(input_ids=chunk, use_cache=True, cache_position=positions, **{arg: cache}).logits.float())
    return torch.cat(logits, dim=1)


@PERPLEXITY_PROTOCOLS.register("kv-chunked", "disjoint windows fed chunk_tokens at a time through the KV cache")
class KVChunked(PerplexityProtocol):
    reads_kv_cache = True
    whole_windows = False  # chunk by chunk through the variant's own cache
    chunk_tokens: int = Field(32, ge=1, description="tokens fed per forward through the KV cache")

    def run(self, model, tokenizer, ids, text, kv, device):  # type: ignore[no-untyped-def]
        return cache_perplexity(model, ids, text, kv, window_tokens=self.window_tokens, chunk_tokens=self.chunk_tokens,
                                batch_size=self.batch_size, device=device)

    @classmethod
    def summary_details(cls, stamp: dict[str, Any]) -> str:
        return f", chunks of {stamp['chunk_tokens']} through the KV cache" if "chunk_tokens" in stamp else ""
