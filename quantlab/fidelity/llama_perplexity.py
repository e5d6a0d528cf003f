"""llama-perplexity's KL-divergence protocol, reproduced so its printed figures can be checked against quantlab's
(``tools/perplexity/perplexity.cpp`` of the llama.cpp that llama-cpp-python 0.3.36 vendors):

- ``--kl-divergence-base FILE`` evaluates disjoint chunks of ``n_ctx`` tokens, each from an empty cache (the first
  token replaced by BOS where the vocabulary adds one), and scores the second half of each: positions
  ``n_ctx/2 … n_ctx−2`` predicting the next token. It writes ``_logits_``, ``n_ctx`` (int32), ``n_vocab`` and
  ``n_chunk`` (int32), the ``n_chunk·n_ctx`` tokens (int32), then per scored position a row of
  ``2·⌈n_vocab/2⌉ + 4`` uint16: the float32 ``scale`` and ``min_log_prob``, then every token's log-probability
  as ``round((logit − min_logit)/scale)`` with ``min_logit = max(min logit, max logit − 16)`` and
  ``scale = (max − min_logit)/65535`` (its ``log_softmax(n_vocab, logits, uint16_t*, tok)``);
- ``--kl-divergence`` scores a second model on the same tokens against those rows (its ``log_softmax(...,
  kl_divergence_result&)``): KL sums ``p_base·(log p_base − log q)`` over the tokens whose stored log-probability
  is above −16, the baseline's NLL and its top token come from the stored rows, Δp = q(next) − p_base(next).

The statistics over those per-position values are ``statistics.llama_statistics`` (the tool's estimators);
``printout`` formats them with the tool's own printf formats, so a figure and the tool's can be compared digit for
digit. The exponentials are float64 rounded to float32 where the tool calls ``expf`` (glibc's is within half an
ulp of that); the last printed digit of a six-decimal figure can differ by one where a value lies on a rounding edge.
"""
from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .statistics import ln_perplexities, root

MAGIC = b"_logits_"
LOG_PROB_FLOOR = -16.0  # stored log-probabilities at or below it are left out of the KL sum


def first_scored(n_ctx: int) -> int:
    """The first position of a chunk the tool scores (``n_ctx/2``); it scores ``n_ctx − 1 − n_ctx/2`` of them."""
    return n_ctx // 2


def row_width(n_vocab: int) -> int:
    """uint16 entries per stored row: two float32 (scale, min_log_prob) and the vocabulary, rounded up to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def _expf(x: torch.Tensor) -> torch.Tensor:
    return x.double().exp().float()


def quantize_log_probs(logits: torch.Tensor) -> np.ndarray:
    """Rows ``[positions, row_width]`` of uint16 as the tool stores the base model's log-probabilities."""
    logits = logits.float()
    top = logits.max(-1, keepdim=True).values
    low = torch.maximum(logits.min(-1, keepdim=True).values, top - 16)
    log_sum_exp = _expf(logits - top).double().sum(-1, keepdim=True).log().float()
    min_log_prob = low - top - log_sum_exp
    scale = (top - low) / np.float32(65535)
    inv = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
    codes = torch.where(logits > low, torch.round(inv * (logits - low)), torch.zeros_like(logits))  # ties to even
    rows = np.zeros((logits.shape[0], row_width(logits.shape[1])), dtype=np.uint16)
    head = np.concatenate([scale.numpy(), min_log_prob.numpy()], axis=1).astype(np.float32)
    rows[:, :4] = head.view(np.uint16)
    rows[:, 4:4 + logits.shape[1]] = codes.numpy().astype(np.uint16)
    return rows


@dataclass
class BaseLogits:
    """A ``--kl-divergence-base`` file: the chunks' tokens and the stored rows of every scored position."""

    n_ctx: int
    n_vocab: int
    tokens: np.ndarray  # [n_chunk, n_ctx] int32, as tokenized (BOS not substituted)
    rows: np.ndarray  # [n_chunk, n_ctx - 1 - n_ctx/2, row_width] uint16

    @property
    def n_chunk(self) -> int:
        return self.tokens.shape[0]

    def to_bytes(self) -> bytes:
        head = MAGIC + struct.pack("<iii", self.n_ctx, self.n_vocab, self.n_chunk)
        return head + self.tokens.astype("<i4").tobytes() + self.rows.astype("<u2").tobytes()

    def write(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def read(cls, path: str | Path) -> "BaseLogits":
        data = Path(path).read_bytes()
        if data[:8] != MAGIC:
            raise ValueError(f"{path}: not a llama-perplexity log-probability file (no {MAGIC!r} header)")
        n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", data, 8)
        offset = 20 + 4 * n_ctx * n_chunk
        tokens = np.frombuffer(data, "<i4", n_ctx * n_chunk, 20).reshape(n_chunk, n_ctx)
        scored = n_ctx - 1 - first_scored(n_ctx)
        rows = np.frombuffer(data, "<u2", n_chunk * scored * row_width(n_vocab), offset)
        return cls(n_ctx, n_vocab, tokens.copy(), rows.reshape(n_chunk, scored, row_width(n_vocab)).copy())

    @classmethod
    def from_logits(cls, tokens: np.ndarray, logits: torch.Tensor) -> "BaseLogits":
        """From each chunk's logits at its scored positions (``[n_chunk, n_ctx − 1 − n_ctx/2, n_vocab]``)."""
        rows = np.stack([quantize_log_probs(chunk) for chunk in logits])
        return cls(tokens.shape[1], logits.shape[-1], np.asarray(tokens, dtype=np.int32), rows)

    def log_probs(self, chunk: int) -> torch.Tensor:
        """The stored base log-probabilities of one chunk's scored positions, ``[positions, n_vocab]`` float32."""
        rows = self.rows[chunk]
        head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
        codes = torch.from_numpy(rows[:, 4:4 + self.n_vocab].astype(np.float32))
        return torch.from_numpy(head[:, :1]) * codes + torch.from_numpy(head[:, 1:2])


def score(logits: torch.Tensor, base_log_probs: torch.Tensor, next_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per scored position, as the tool scores a model against stored rows: ``kl``, ``nll``, ``nll_base``,
    ``delta_p`` and ``same_top`` (the first maxima of both agree). ``logits`` ``[positions, n_vocab]`` float32."""
    logits = logits.float()
    top, first = logits.max(-1).values, logits.argmax(-1)  # the first maximum, as the tool's loop finds it
    log_sum_exp = _expf(logits - top[:, None]).double().sum(-1).log().float()
    nll = top + log_sum_exp - logits.gather(-1, next_tokens[:, None]).squeeze(-1)
    nll_base = -base_log_probs.gather(-1, next_tokens[:, None]).squeeze(-1)
    shifted = top + log_sum_exp
    kept = base_log_probs > LOG_PROB_FLOOR
    terms = _expf(base_log_probs) * (base_log_probs - logits + shifted[:, None])
    kl = torch.where(kept, terms, torch.zeros_like(terms)).double().sum(-1)
    return {"kl": kl, "nll": nll, "nll_base": nll_base, "delta_p": _expf(-nll) - _expf(-nll_base),
            "same_top": first == base_log_probs.argmax(-1)}


def perplexities(nll: torch.Tensor, nll_base: torch.Tensor, float32_products: bool = False) -> dict[str, float]:
    """The tool's "Perplexity statistics" that ``llama_statistics`` does not return: PPL(Q) and PPL(base) with
    their uncertainties, their ratio and difference with theirs (``float32_products`` as ``llama_statistics``)."""
    log_q, unc_q, log_b, unc_b, cov = ln_perplexities(nll, nll_base, float32_products)
    ppl_q, ppl_b = math.exp(log_q), math.exp(log_b)
    ratio = math.exp(log_q - log_b)
    return {"ppl": ppl_q, "ppl_uncertainty": ppl_q * unc_q, "ppl_base": ppl_b, "ppl_base_uncertainty": ppl_b * unc_b,
            "ppl_ratio": ratio, "ppl_ratio_uncertainty": ratio * root(unc_q ** 2 + unc_b ** 2 - 2 * cov, float32_products),
            "ppl_difference": ppl_q - ppl_b,
            "ppl_difference_uncertainty": root((ppl_q * unc_q) ** 2 + (ppl_b * unc_b) ** 2 - 2 * ppl_q * ppl_b * cov,
                                               float32_products)}


def _number(value: float, width: int, decimals: int) -> str:
    """``%{width}.{decimals}lf`` as glibc prints it: the NaN of a negative variance's square root is ``-nan``."""
    return "-nan".rjust(width) if math.isnan(value) else f"{value:{width}.{decimals}f}"


def printout(stats: dict[str, Any], ppl: dict[str, float]) -> list[str]:
    """The tool's closing statistics, line by line in its printf formats, from ``llama_statistics`` and
    ``perplexities``."""
    kq, dq = stats["kl_divergence_quantiles"], stats["delta_p_quantiles_percent"]
    def pm(value: float, uncertainty: float) -> str:
        return f"{_number(value, 10, 6)} ± {_number(uncertainty, 10, 6)}"

    lines = [f"Mean PPL(Q)                   : {pm(ppl['ppl'], ppl['ppl_uncertainty'])}",
             f"Mean PPL(base)                : {pm(ppl['ppl_base'], ppl['ppl_base_uncertainty'])}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {_number(stats['ln_ppl_correlation_percent'], 6, 2)}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {pm(stats['ln_ppl_ratio_mean'], stats['ln_ppl_ratio_uncertainty'])}",
             f"Mean PPL(Q)/PPL(base)         : {pm(ppl['ppl_ratio'], ppl['ppl_ratio_uncertainty'])}",
             f"Mean PPL(Q)-PPL(base)         : {pm(ppl['ppl_difference'], ppl['ppl_difference_uncertainty'])}",
             f"Mean    KLD: {pm(stats['kl_divergence_mean'], stats['kl_divergence_mean_uncertainty'])}"]
    names = {"max": "Maximum", "median": "Median ", "min": "Minimum"}
    lines += [f"{names.get(k) or (k + '%').rjust(5) + '  '} KLD: {v:10.6f}" for k, v in kq.items()]
    lines.append(f"Mean    Δp: {stats['delta_p_mean_percent']:6.3f} ± {stats['delta_p_mean_uncertainty_percent']:5.3f} %")
    lines += [f"{names.get(k) or (k + '%').rjust(5) + '  '} Δp: {v:6.3f}%" for k, v in dq.items()]
    lines += [f"RMS Δp    : {stats['delta_p_rms_percent']:6.3f} ± {stats['delta_p_rms_uncertainty_percent']:5.3f} %",
              f"Same top p: {stats['same_top_p_percent']:6.3f} ± {stats['same_top_p_uncertainty_percent']:5.3f} %"]
    return lines


_STAT_LINE = re.compile(r"^(Mean|Cor|Maximum|Median|Minimum|RMS|Same|\s*\d+\.\d%)")


def printed(output: str) -> list[str]:
    """The closing statistics lines of a ``llama-perplexity --kl-divergence`` run's output (its log lines dropped)."""
    start = output.find("====== Perplexity statistics ======")
    if start < 0:
        raise ValueError("no '====== Perplexity statistics ======' block in llama-perplexity's output")
    return [line.rstrip() for line in output[start:].splitlines()
            if _STAT_LINE.match(line) and not line.startswith("======")]
