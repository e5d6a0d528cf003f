"""Token ids of a text, cut to a length and named for the cut, and the hash that names ids themselves."""
from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..data import Text, load_text


def tokenize(tokenizer: Any, text: Text) -> torch.Tensor:
    return torch.tensor(tokenizer(text.text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def token_ids_sha256(ids: torch.Tensor) -> str:
    """The SHA-256 of token ids as stored (what a stamp names when the ids, not a text, were scored)."""
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def scored_text(source: Any, tokenizer: Any, max_tokens: int | None) -> tuple[torch.Tensor, Text]:
    """The token ids of a recipe's text, cut to ``max_tokens``, and the text they are (named for the cut)."""
    text = load_text(source)
    ids = tokenize(tokenizer, text)
    if max_tokens is not None and ids.numel() > max_tokens:
        ids = ids[:max_tokens]
        text = Text(f"{text.source}[:{max_tokens} tokens]", tokenizer.decode(ids))
    return ids, text
