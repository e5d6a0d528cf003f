"""quantlab's llama.cpp engine beside llama.cpp's own ``llama-perplexity --kl-divergence`` on the same GGUF files and
text: the tool writes the baseline's log-probabilities (``--kl-divergence-base``) and prints each variant's
statistics; quantlab takes the same chunks' logits from its engine (llama-cpp-python, one context per chunk), scores
them as the tool does (``fidelity.llama_perplexity``) with ``fidelity.statistics.llama_statistics`` and prints them in
the tool's formats, so the two printouts can be compared line by line (``benchmarks/llama_perplexity.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...fidelity.llama_perplexity import BaseLogits, first_scored, perplexities, printed, printout, score
from ...fidelity.statistics import llama_statistics
from .engine import ask_for_arrays
from .process import LlamaCppProcess
from .tools import run_tool


@dataclass
class Tool:
    """How ``llama-perplexity`` is run: its path, the context (chunk) length, the chunks and the threads."""

    path: Path
    n_ctx: int = 512
    chunks: int = 8
    threads: int = 2

    def _args(self, gguf: Path, text: Path) -> list[str]:
        return ["-m", str(gguf), "-f", str(text), "-c", str(self.n_ctx), "-b", str(self.n_ctx),
                "--chunks", str(self.chunks), "-t", str(self.threads), "-fa", "off"]

    def write_base(self, gguf: Path, text: Path, base_file: Path) -> BaseLogits:
        """The tool's ``--kl-divergence-base`` file of the baseline ``gguf`` on ``text``, read back."""
        run_tool(self.path, *self._args(gguf, text), "--kl-divergence-base", str(base_file))
        return BaseLogits.read(base_file)

    def divergence(self, gguf: Path, text: Path, base_file: Path) -> list[str]:
        """The closing statistics the tool prints for ``gguf`` against the base file."""
        output = run_tool(self.path, *self._args(gguf, text), "--kl-divergence-base", str(base_file),
                          "--kl-divergence")
        return printed(output)


def bos_substitution(gguf: Path) -> int | None:
    """The BOS token the tool puts first in every chunk, from the file's tokenizer metadata; None where it adds none
    (``tokenizer.ggml.add_bos_token`` false or absent)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields

    def value(name: str) -> int | None:
        field = fields.get(name)
        return None if field is None else int(field.parts[field.data[0]][0])

    return value("tokenizer.ggml.bos_token_id") if value("tokenizer.ggml.add_bos_token") else None


def engine_logits(gguf: Path, base: BaseLogits, threads: int) -> torch.Tensor:
    """quantlab's llama.cpp engine's logits at the tool's scored positions of each chunk
    (``[n_chunk, n_ctx − 1 − n_ctx/2, n_vocab]``), each chunk from an empty context with the tool's BOS rule."""
    chunks = base.tokens.astype(np.int64).copy()
    bos = bos_substitution(gguf)
    if bos is not None:
        chunks[:, 0] = bos
    with LlamaCppProcess(gguf, threads=threads, cache_type="f16", n_ctx=base.n_ctx) as llama:
        logits = ask_for_arrays(llama, "logits.npy", cmd="logits", windows=chunks.tolist(), window=base.n_ctx,
                                 all_positions=True)["logits"]
    return logits[:, first_scored(base.n_ctx): base.n_ctx - 1].float()


def quantlab_printout(logits: torch.Tensor, base: BaseLogits, base_log_probs: torch.Tensor | None = None) -> list[str]:
    """quantlab's figures for a variant's scored logits in the tool's printout. Against the base file's stored
    (16-bit) rows by default, as the tool scores; ``base_log_probs`` (``[n_chunk, positions, n_vocab]``) scores
    against exact ones instead, to show what the tool's storage changes."""
    first = first_scored(base.n_ctx)
    parts = []
    for chunk in range(base.n_chunk):
        reference = base.log_probs(chunk) if base_log_probs is None else base_log_probs[chunk]
        next_tokens = torch.from_numpy(base.tokens[chunk, first + 1:].astype(np.int64))
        parts.append(score(logits[chunk], reference, next_tokens))
    per = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    stats = llama_statistics(per["kl"], per["nll"], per["nll_base"], per["delta_p"], per["same_top"],
                             float32_products=True)
    return printout(stats, perplexities(per["nll"], per["nll_base"], float32_products=True))


def compare_lines(ours: list[str], theirs: list[str]) -> list[tuple[str, str]]:
    """The pairs of lines that differ (quantlab's, the tool's); an extra or missing line pairs with ``""``."""
    width = max(len(ours), len(theirs))
    ours, theirs = ours + [""] * (width - len(ours)), theirs + [""] * (width - len(theirs))
    return [(a, b) for a, b in zip(ours, theirs) if a.strip() != b.strip()]
