"""Token ids of a text, cut to a length and named for the cut, and the hash that names ids themselves."""
from __future__ import annotations

from typing import Any

import torch

from ..data import Text, load_text, token_ids_sha256, tokenize  # noqa: F401  (the evaluations' names for them)


def scored_text(source: Any, tokenizer: Any, max_tokens: int | None) -> tuple[torch.Tensor, Text]:
    """The token ids of a recipe's text, cut to ``max_tokens``, and the text they are (named for the cut)."""
    text = load_text(source)
    ids = tokenize(tokenizer, text)
    if max_tokens is not None and ids.numel() > max_tokens:
        ids = ids[:max_tokens]
        text = Text(f"{text.source}[:{max_tokens} tokens]", tokenizer.decode(ids))
    return ids, text
