"""Perplexity under a named protocol, stamped on every number.

``windows``: join the text, tokenize once, score non-overlapping windows of N tokens (the GPTQ
paper's method; each window starts without context). ``sliding``: window N every S tokens, each
token scored once (HF's "perplexity of fixed-length models")."""
from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data import Text
from ..errors import QuantlabError
from ..progress import progress
from .protocols import PERPLEXITY_PROTOCOLS, PerplexityProtocol


def tokenize(tokenizer: Any, text: Text) -> torch.Tensor:
    return torch.tensor(tokenizer(text.text, add_special_tokens=False)["input_ids"], dtype=torch.long)


Span = tuple[int, int, int]  # (begin, end, scored): the last `scored` tokens of ids[begin:end] are scored


def token_ids_sha256(ids: torch.Tensor) -> str:
    """The SHA-256 of token ids as stored (what a stamp names when the ids, not a text, were scored)."""
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def window_spans(n_tokens: int, window_tokens: int, stride_tokens: int) -> list[Span]:
    """Windows of ``window_tokens`` every ``stride_tokens``; each token is scored once, in the first window
    that holds it after the tokens already scored (HF's fixed-length perplexity). ``stride == window``
    gives disjoint windows, each scoring all its tokens but the first (the GPTQ paper's protocol)."""
    spans: list[Span] = []
    scored_until = 0
    for begin in range(0, n_tokens, stride_tokens):
        end = min(begin + window_tokens, n_tokens)
        scored = min(end - scored_until, end - begin - 1)
        if scored > 0:
            spans.append((begin, end, scored))
        scored_until = end
        if end == n_tokens:
            break
    return spans


@torch.inference_mode()
def _negative_log_likelihood(model: nn.Module, ids: torch.Tensor, spans: list[Span], batch_size: int,
                             device: torch.device) -> tuple[float, int]:
    """Summed NLL and count of the scored tokens; spans of the same shape run as one batch."""
    groups: dict[tuple[int, int], list[int]] = {}
    for begin, end, scored in spans:
        groups.setdefault((end - begin, scored), []).append(begin)
    nll, count = 0.0, 0
    batches = [(length, scored, begins[c: c + batch_size]) for (length, scored), begins in groups.items()
               for c in range(0, len(begins), batch_size)]
    for length, scored, chunk_begins in progress(batches, "perplexity, batches of windows"):
        batch = torch.stack([ids[b: b + length] for b in chunk_begins]).to(device)
        logits = model(input_ids=batch).logits[:, length - scored - 1: length - 1].float()
        targets = batch[:, length - scored:]
        nll += F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum").item()
        count += targets.numel()
    return nll, count


def _stamped(nll: float, scored: int, protocol: dict[str, Any], text: Text) -> dict[str, Any]:
    """The perplexity of ``scored`` tokens with summed NLL ``nll``, and the protocol that produced it."""
    if not math.isfinite(nll):
        raise QuantlabError("perplexity is not finite (the model produced NaN or Inf logits)")
    return {
        "perplexity": round(math.exp(nll / scored), 4),
        "perplexity_protocol": {**protocol, "scored_tokens": scored, "text": text.source, "text_sha256": text.sha256},
    }


def perplexity(
    model: nn.Module, ids: torch.Tensor, text: Text, *, protocol: str, window_tokens: int, batch_size: int,
    device: torch.device, stride_tokens: int | None = None,
) -> dict[str, Any]:
    """Token perplexity under ``protocol`` (``windows`` or ``sliding``), with the protocol stamped beside it.

    ``windows``: disjoint windows, the tail shorter than a window dropped (as the GPTQ paper does).
    ``sliding``: windows every ``stride_tokens``, each token scored once with up to ``window - stride``
    tokens of context before the scored part.
    """
    if ids.numel() < (window_tokens if protocol == "windows" else 2):
        raise QuantlabError(f"the text has {ids.numel()} tokens, too few for protocol {protocol} (window {window_tokens})")
    if protocol == "windows":
        stride_tokens = window_tokens
        ids = ids[: ids.numel() // window_tokens * window_tokens]
    elif stride_tokens is None or not 0 < stride_tokens <= window_tokens:
        raise QuantlabError(f"protocol sliding needs 0 < stride_tokens <= window_tokens, got {stride_tokens}")
    nll, scored = _negative_log_likelihood(model, ids, window_spans(ids.numel(), window_tokens, stride_tokens),
                                           batch_size, device)
    return _stamped(nll, scored, {"name": protocol, "window_tokens": window_tokens, "stride_tokens": stride_tokens}, text)


@torch.inference_mode()
def cache_perplexity(
    model: nn.Module, ids: torch.Tensor, text: Text, kv: Any, *, window_tokens: int, chunk_tokens: int,
    batch_size: int, device: torch.device,
) -> dict[str, Any]:
    """Protocol ``kv-chunked``: disjoint windows as in ``windows``, each fed ``chunk_tokens`` at a time
    through a fresh cache of KV format ``kv``, so every chunk attends to the stored (quantized) keys and
    values of the chunks before it. Scores the same tokens as ``windows``."""
    from .latency import cache_kwarg

    n_windows = ids.numel() // window_tokens
    if n_windows == 0:
        raise QuantlabError(f"the text has {ids.numel()} tokens, fewer than one window of {window_tokens}")
    windows = ids[: n_windows * window_tokens].view(n_windows, window_tokens)
    arg = cache_kwarg(model)
    nll, scored = 0.0, 0
    for batch in progress(windows.split(batch_size), "perplexity through the cache, batches"):
        batch = batch.to(device)
        cache = kv.make_cache(model.config)
        logits = []
        for start in range(0, window_tokens, chunk_tokens):
            chunk = batch[:, start: start + chunk_tokens]
            positions = torch.arange(start, start + chunk.shape[1], device=device)
            logits.append(model(input_ids=chunk, use_cache=True, cache_position=positions, **{arg: cache}).logits.float())
        full = torch.cat(logits, dim=1)[:, :-1]
        nll += F.cross_entropy(full.reshape(-1, full.size(-1)), batch[:, 1:].reshape(-1), reduction="sum").item()
        scored += batch[:, 1:].numel()
    return _stamped(nll, scored, {"name": "kv-chunked", "window_tokens": window_tokens, "stride_tokens": window_tokens,
                                  "chunk_tokens": chunk_tokens, "kv_format": kv.label}, text)


def _stride_is_window(name: str, spec: Any) -> str | None:
    if spec.stride_tokens not in (None, spec.window_tokens):
        return f"protocol {name} has stride = window; use protocol sliding for another stride"
    return None


@PERPLEXITY_PROTOCOLS.register("windows", "disjoint windows, each from an empty context (the GPTQ paper's)")
class Windows(PerplexityProtocol):
    def check(self, spec: Any) -> str | None:
        return _stride_is_window("windows", spec)

    def run(self, model, tokenizer, ids, text, spec, kv, device):  # type: ignore[no-untyped-def]
        return perplexity(model, ids, text, protocol="windows", window_tokens=spec.window_tokens,
                          batch_size=spec.batch_size, device=device)


@PERPLEXITY_PROTOCOLS.register("sliding", "windows every stride_tokens, each token scored once (HF's fixed-length)")
class Sliding(PerplexityProtocol):
    def check(self, spec: Any) -> str | None:
        if spec.stride_tokens is None or spec.stride_tokens > spec.window_tokens:
            return "protocol sliding needs stride_tokens between 1 and window_tokens"
        return None

    def run(self, model, tokenizer, ids, text, spec, kv, device):  # type: ignore[no-untyped-def]
        return perplexity(model, ids, text, protocol="sliding", window_tokens=spec.window_tokens,
                          stride_tokens=spec.stride_tokens, batch_size=spec.batch_size, device=device)


@PERPLEXITY_PROTOCOLS.register("kv-chunked", "disjoint windows fed chunk_tokens at a time through the KV cache")
class KVChunked(PerplexityProtocol):
    reads_kv_cache = True

    def check(self, spec: Any) -> str | None:
        return _stride_is_window("kv-chunked", spec)

    def run(self, model, tokenizer, ids, text, spec, kv, device):  # type: ignore[no-untyped-def]
        return cache_perplexity(model, ids, text, kv, window_tokens=spec.window_tokens, chunk_tokens=spec.chunk_tokens,
                                batch_size=spec.batch_size, device=device)


def protocol_summary(protocol: dict[str, Any]) -> str:
    """One line that says how a perplexity was obtained."""
    chunk = f", chunks of {protocol['chunk_tokens']} through the KV cache" if "chunk_tokens" in protocol else ""
    return (f"{protocol['name']}: window {protocol['window_tokens']}, stride {protocol['stride_tokens']}{chunk}, "
            f"{protocol['scored_tokens']:,} scored tokens of {protocol['text']} (sha256 {protocol['text_sha256'][:12]})")
