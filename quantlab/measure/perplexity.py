"""Perplexity under a named protocol. ``windows``: join the text, tokenize once, score
non-overlapping windows of N tokens (the GPTQ paper's method; each window starts without context)."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data import Text
from ..errors import QuantlabError


def tokenize(tokenizer: Any, text: Text) -> torch.Tensor:
    return torch.tensor(tokenizer(text.text, add_special_tokens=False)["input_ids"], dtype=torch.long)


@torch.inference_mode()
def windows_perplexity(
    model: nn.Module, ids: torch.Tensor, text: Text, *, window_tokens: int, batch_size: int,
    device: torch.device, max_tokens: int | None = None,
) -> dict[str, Any]:
    """Token perplexity over non-overlapping windows; the protocol is returned beside the number."""
    if max_tokens is not None:
        ids = ids[:max_tokens]
    n_windows = ids.numel() // window_tokens
    if n_windows == 0:
        raise QuantlabError(f"the text has {ids.numel()} tokens, fewer than one window of {window_tokens}")
    windows = ids[: n_windows * window_tokens].view(n_windows, window_tokens)
    nll, scored = 0.0, 0
    for batch in windows.split(batch_size):
        batch = batch.to(device)
        logits = model(input_ids=batch).logits[:, :-1].float()
        targets = batch[:, 1:]
        nll += F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum").item()
        scored += targets.numel()
    if not math.isfinite(nll):
        raise QuantlabError("perplexity is not finite (the model produced NaN or Inf logits)")
    return {
        "perplexity": round(math.exp(nll / scored), 4),
        "perplexity_protocol": {
            "name": "windows", "window_tokens": window_tokens, "stride_tokens": window_tokens,
            "scored_tokens": scored, "text": text.source, "text_sha256": text.sha256,
        },
    }


def protocol_summary(protocol: dict[str, Any]) -> str:
    """One line that says how a perplexity was obtained."""
    return (f"{protocol['name']}: window {protocol['window_tokens']}, stride {protocol['stride_tokens']}, "
            f"{protocol['scored_tokens']:,} scored tokens of {protocol['text']} (sha256 {protocol['text_sha256'][:12]})")
