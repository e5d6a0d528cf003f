"""Calibration data from a text: seeded random windows of its tokens, as GPTQ samples C4."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...data import BUILTIN_TEXTS, Text, calibration_samples, load_text, tokenize
from ..format import Calibration


def calibration_from_text(tokenizer: Any, text: str | Text | Any, samples: int = 128, seq_len: int = 256,
                          seed: int = 0) -> Calibration:
    """``samples`` windows of ``seq_len`` tokens of ``text`` at seeded random offsets, for ``quantize_``.

    ``text``: a built-in text's name (``stdlib-train``, ...), the path of a .txt / .jsonl file, a ``Text``, a
    ``DatasetText``, or else the text itself. The same text, tokenizer and seed give the same windows (a recipe's
    ``calibration:`` section is this call)."""
    if isinstance(text, str) and text not in BUILTIN_TEXTS and not (len(text) < 4096 and "\n" not in text
                                                                    and Path(text).is_file()):
        text = Text("<text>", text)
    loaded = text if isinstance(text, Text) else load_text(text)
    return Calibration(calibration_samples(tokenize(tokenizer, loaded), samples, seq_len, seed), tokenizer)
