"""The perplexity-protocol interface and the scoring the built-in protocols share.

A protocol is a frozen config registered by name, like a weight format: ``{protocol: NAME, field: value...}`` in
a recipe's ``evaluations.perplexity`` builds it. It owns its fields (beyond the shared ``window_tokens``,
``max_tokens``, ``text``, ``batch_size``), the extra results it reports (``extra_result``), the sentence that says
how its figure was obtained (``summary``) and what must match for two runs' figures to be compared
(``comparison_key``). Adding one is a module with ``@PERPLEXITY_PROTOCOLS.register(name, summary)``, imported by
this package's ``__init__``.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, model_serializer
from torch import nn

from ...data import BUILTIN_TEXTS, Text, TextSource
from ...errors import QuantlabError
from ...fidelity.log_probs import nll_sum
from ...progress import progress
from ...registry import Registry
from ..base import Evaluation

DEFAULT_PROTOCOL = "windows"
DEFAULT_KV_PROTOCOL = "kv-chunked"  # the default when a recipe compares KV formats: one that reads the cache


class PerplexityProtocol(Evaluation):
    """Base of perplexity protocols: the fields every protocol takes, and how its stamp reads. As the recipe's
    ``evaluations.perplexity`` entry, ``{protocol: NAME, fields...}`` builds the protocol NAME names."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    reads_kv_cache: ClassVar[bool] = False  # whether the figure depends on the KV format
    whole_windows: ClassVar[bool] = True  # scored from whole windows' logits (an engine outside this process can)
    extra_result: ClassVar[type[BaseModel] | None] = None  # further result fields (optional floats) it reports

    window_tokens: int = Field(256, ge=2)
    max_tokens: int | None = Field(None, ge=2, description="score at most this many tokens of the text")
    text: TextSource = Field("bundled-heldout", description=f"one of {', '.join(BUILTIN_TEXTS)}, a .txt/.jsonl file "
                             "or a dataset")
    batch_size: int = Field(8, ge=1, description="windows per forward pass")

    @property
    def name(self) -> str:
        return PERPLEXITY_PROTOCOLS.canonical_name(self)

    @classmethod
    def parse(cls, value: Any, recipe: dict[str, Any]) -> "PerplexityProtocol":
        """The protocol ``value`` names (default: windows, or kv-chunked where the recipe compares KV formats)."""
        if isinstance(value, PerplexityProtocol):
            return value
        params = dict(value or {})
        name = params.pop("protocol", None) or default_protocol(recipe)
        return PERPLEXITY_PROTOCOLS[name].build(**params)

    def engine_refusal(self, engine: Any) -> str | None:
        if engine.in_process or type(self).whole_windows:
            return None
        allowed = [n for n in PERPLEXITY_PROTOCOLS.names() if PERPLEXITY_PROTOCOLS[n].cls.whole_windows]
        return (f"protocol {self.name} does not score whole windows from an empty context; an engine outside this "
                f"process scores protocols {', '.join(allowed)}")

    @model_serializer(mode="wrap")
    def _with_name(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        """The recipe form: ``protocol`` first (left out with the other defaults when it is the default)."""
        data = handler(self)
        name = self.name
        return data if info.exclude_defaults and name == DEFAULT_PROTOCOL else {"protocol": name, **data}

    def run(self, model: nn.Module, tokenizer: Any, ids: torch.Tensor, text: Text, kv: Any,
            device: torch.device) -> dict[str, Any]:
        """``{"perplexity": float, "perplexity_protocol": {...}, ...}`` for the model on ``ids`` / ``text``."""
        raise NotImplementedError

    @classmethod
    def summary(cls, stamp: dict[str, Any]) -> str:
        """One line from a recorded ``perplexity_protocol`` stamp: how the figure was obtained."""
        return (f"{stamp['name']}: window {stamp['window_tokens']}, stride {stamp['stride_tokens']}{cls.summary_details(stamp)}, "
                f"{stamp['scored_tokens']:,} scored tokens of {stamp['text']} (sha256 {stamp['text_sha256'][:12]})")

    @classmethod
    def summary_details(cls, stamp: dict[str, Any]) -> str:
        """What this protocol adds to the summary after window and stride (e.g. ``, chunks of 32 ...``)."""
        return ""

    @classmethod
    def comparison_key(cls, stamp: dict[str, Any]) -> str:
        """What must be equal for two runs' perplexities to be compared (``quantlab compare`` lists a difference)."""
        return (f"{stamp.get('name')}, window {stamp.get('window_tokens')}, stride {stamp.get('stride_tokens')}, "
                f"text sha256 {str(stamp.get('text_sha256'))[:12]}")


PERPLEXITY_PROTOCOLS: Registry[PerplexityProtocol] = Registry("perplexity protocol")


def default_protocol(recipe: dict[str, Any]) -> str:
    """kv-chunked where the recipe compares KV formats (quality must then read the cache), else windows."""
    from ...kv import KV_FORMATS

    names = [KV_FORMATS.canonical_name(k) if not isinstance(k, (str, dict)) else
             (k if isinstance(k, str) else str(k.get("format"))) for k in recipe.get("kv_cache") or []]
    return DEFAULT_KV_PROTOCOL if any(n != "native" for n in names) else DEFAULT_PROTOCOL


def protocol_of(stamp: dict[str, Any]) -> type[PerplexityProtocol]:
    """The registered protocol class a recorded stamp names (the base for a name no longer registered)."""
    name = stamp.get("name")
    return PERPLEXITY_PROTOCOLS[name].cls if isinstance(name, str) and name in PERPLEXITY_PROTOCOLS else PerplexityProtocol


def protocol_summary(stamp: dict[str, Any]) -> str:
    """One line that says how a perplexity was obtained, in the words of the protocol that made it."""
    return protocol_of(stamp).summary(stamp)


Span = tuple[int, int, int]  # (begin, end, scored): the last `scored` tokens of ids[begin:end] are scored


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
def negative_log_likelihood(model: nn.Module, ids: torch.Tensor, spans: list[Span], batch_size: int,
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
        nll += nll_sum(logits, targets)
        count += targets.numel()
    return nll, count


def stamped(nll: float, scored: int, protocol: dict[str, Any], text: Text) -> dict[str, Any]:
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
    nll, scored = negative_log_likelihood(model, ids, window_spans(ids.numel(), window_tokens, stride_tokens),
                                           batch_size, device)
    return stamped(nll, scored, {"name": protocol, "window_tokens": window_tokens, "stride_tokens": stride_tokens}, text)
