"""llama-perplexity's stored base rows, its per-position scoring and its printout, against direct computations
(the comparison with the tool itself: tests/fidelity/test_llama_perplexity_tool.py, and
benchmarks/llama_perplexity.py on SmolLM2-135M)."""
from pathlib import Path

import numpy as np
import pytest
import torch

from quantlab.fidelity.llama_perplexity import (
    BaseLogits,
    first_scored,
    perplexities,
    printed,
    printout,
    quantize_log_probs,
    row_width,
    score,
)
from quantlab.fidelity.statistics import llama_statistics

VOCAB = 301  # odd: the stored rows carry one uint16 of padding


def _logits(positions: int, seed: int = 0, spread: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(positions, VOCAB, generator=g) * spread


def test_stored_rows_hold_the_log_probabilities_within_half_a_step() -> None:
    logits = _logits(40)
    rows = quantize_log_probs(logits)
    assert rows.shape == (40, row_width(VOCAB)) == (40, 2 * 151 + 4) and rows.dtype == np.uint16
    assert (rows[:, -1] == 0).all()  # the padding entry
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    top, low = logits.max(-1).values, torch.maximum(logits.min(-1).values, logits.max(-1).values - 16)
    assert torch.allclose(torch.from_numpy(head[:, 0]), (top - low) / 65535)
    exact = logits.log_softmax(-1)
    stored = BaseLogits(2, VOCAB, np.zeros((1, 2), np.int32), rows[None]).log_probs(0)
    above = logits > low[:, None]
    step = torch.from_numpy(head[:, :1]).expand_as(logits)
    err = (stored - exact).abs()
    assert (err[above] <= step[above] / 2 + 1e-5 * exact[above].abs()).all()
    # at or below the floor (16 nats under the top) the code is 0: the floor's log-probability
    assert torch.allclose(stored[~above], torch.from_numpy(head[:, 1:2]).expand_as(logits)[~above])
    assert (rows[:, 4:4 + VOCAB].max(1) == 65535).all()  # the top token takes the last code


def test_base_file_round_trips_with_the_tools_layout(tmp_path: Path) -> None:
    n_ctx, n_chunk = 16, 3
    tokens = np.arange(n_ctx * n_chunk, dtype=np.int32).reshape(n_chunk, n_ctx)
    scored = n_ctx - 1 - first_scored(n_ctx)
    base = BaseLogits.from_logits(tokens, _logits(n_chunk * scored).reshape(n_chunk, scored, VOCAB))
    base.write(tmp_path / "base.bin")
    data = (tmp_path / "base.bin").read_bytes()
    assert data[:8] == b"_logits_" and len(data) == 8 + 12 + 4 * n_ctx * n_chunk + 2 * n_chunk * scored * row_width(VOCAB)
    again = BaseLogits.read(tmp_path / "base.bin")
    assert (again.n_ctx, again.n_vocab, again.n_chunk) == (n_ctx, VOCAB, n_chunk)
    assert np.array_equal(again.tokens, tokens) and np.array_equal(again.rows, base.rows)
    (tmp_path / "bad.bin").write_bytes(b"not logits")
    with pytest.raises(ValueError, match="_logits_"):
        BaseLogits.read(tmp_path / "bad.bin")


def test_scoring_against_stored_rows_approaches_the_exact_figures() -> None:
    base_logits = _logits(200, seed=1)
    variant = base_logits + 0.3 * _logits(200, seed=2, spread=1.0)
    nxt = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(3))
    stored = BaseLogits(2, VOCAB, np.zeros((1, 2), np.int32), quantize_log_probs(base_logits)[None]).log_probs(0)
    got = score(variant, stored, nxt)
    p, q = base_logits.log_softmax(-1), variant.log_softmax(-1)
    exact_kl = (p.exp() * (p - q)).sum(-1)
    # 16 nats under the top holds all but e^-16 of the mass: the KL differs by the rounding of the stored values
    assert torch.allclose(got["kl"].float(), exact_kl, atol=2e-3)
    assert torch.allclose(got["nll"], -q.gather(-1, nxt[:, None]).squeeze(-1), atol=1e-5)
    exact_base = -p.gather(-1, nxt[:, None]).squeeze(-1)
    kept = base_logits.gather(-1, nxt[:, None]).squeeze(-1) > base_logits.max(-1).values - 16
    assert kept.any() and (~kept).any()
    assert torch.allclose(got["nll_base"][kept], exact_base[kept], atol=2e-3)
    assert (got["nll_base"][~kept] <= exact_base[~kept]).all()  # a token under the floor reads as the floor
    assert torch.allclose(got["delta_p"], q.exp().gather(-1, nxt[:, None]).squeeze(-1)
                          - p.exp().gather(-1, nxt[:, None]).squeeze(-1), atol=1e-4)
    assert torch.equal(got["same_top"], variant.argmax(-1) == base_logits.argmax(-1))
    same = score(base_logits, stored, nxt)  # the base against its own rows: only the rounding of the rows
    assert same["kl"].abs().max() < 1e-3 and same["same_top"].all()


def test_perplexities_follow_the_mean_nll() -> None:
    g = torch.Generator().manual_seed(0)
    nll_base = torch.rand(500, generator=g) * 4
    nll = nll_base + 0.1 + 0.05 * torch.randn(500, generator=g)
    got = perplexities(nll, nll_base)
    assert got["ppl"] == pytest.approx(float(nll.double().mean().exp()))
    assert got["ppl_base"] == pytest.approx(float(nll_base.double().mean().exp()))
    assert got["ppl_ratio"] == pytest.approx(got["ppl"] / got["ppl_base"])
    assert got["ppl_difference"] == pytest.approx(got["ppl"] - got["ppl_base"])
    # strongly correlated series: the ratio's uncertainty is far below that of either perplexity alone
    assert got["ppl_ratio_uncertainty"] < 0.2 * got["ppl_uncertainty"] / got["ppl"]


# llama-perplexity of llama-cpp-python 0.3.36's llama.cpp (scripts/build_llama_perplexity.sh), its stdout for the
# bundled model's GGUF Q4_K export against its BF16 export on bundled-heldout:
#   llama-perplexity -m Q4_K/model.gguf -f heldout.txt -c 256 -b 256 --chunks 4 -t 2 -fa off \
#       --kl-divergence-base base.bin --kl-divergence
TOOL_OUTPUT = """\
chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      63.8646 ±   15.3795      -0.00683 ±    0.00711       0.00310 ±    0.00029     0.920 ±  0.128 %    92.913 ±  2.286 %
   2      65.4184 ±   11.0109      -0.00562 ±    0.00468       0.00299 ±    0.00017     0.795 ±  0.086 %    95.276 ±  1.334 %
   3      62.1600 ±    8.6197      -0.00180 ±    0.00377       0.00302 ±    0.00013     0.858 ±  0.068 %    95.538 ±  1.059 %
   4      58.3183 ±    7.0880      -0.00232 ±    0.00320       0.00280 ±    0.00011     0.824 ±  0.056 %    96.260 ±  0.843 %

====== Perplexity statistics ======
Mean PPL(Q)                   :  58.318339 ±   7.087953
Mean PPL(base)                :  58.454058 ±   7.118856
Cor(ln(PPL(Q)), ln(PPL(base))):  99.97%
Mean ln(PPL(Q)/PPL(base))     :  -0.002325 ±   0.003199
Mean PPL(Q)/PPL(base)         :   0.997678 ±   0.003192
Mean PPL(Q)-PPL(base)         :  -0.135720 ±   0.188774

====== KL divergence statistics ======
Mean    KLD:   0.002804 ±   0.000109
Maximum KLD:   0.028670
99.9%   KLD:   0.022218
99.0%   KLD:   0.011998
95.0%   KLD:   0.006991
90.0%   KLD:   0.005366
Median  KLD:   0.002265
10.0%   KLD:   0.000803
 5.0%   KLD:   0.000484
 1.0%   KLD:   0.000196
 0.1%   KLD:   0.000073
Minimum KLD:   0.000065

====== Token probability statistics ======
Mean    Δp:  0.019 ± 0.037 %
Maximum Δp:  4.701%
99.9%   Δp:  4.227%
99.0%   Δp:  2.612%
95.0%   Δp:  1.417%
90.0%   Δp:  0.580%
75.0%   Δp:  0.069%
Median  Δp:  0.000%
25.0%   Δp: -0.063%
10.0%   Δp: -0.641%
 5.0%   Δp: -1.270%
 1.0%   Δp: -2.342%
 0.1%   Δp: -3.718%
Minimum Δp: -3.777%
RMS Δp    :  0.824 ± 0.056 %
Same top p: 96.260 ± 0.843 %
"""


def test_printout_has_the_tools_lines_in_its_order_and_formats() -> None:
    """Every line quantlab prints has the label, width and order of the tool's (a kept sample of its output)."""
    tool = printed(TOOL_OUTPUT)
    assert len(tool) == 6 + 1 + 11 + 1 + 13 + 2
    kl = torch.rand(1000, generator=torch.Generator().manual_seed(0)) * 0.01
    nll_base = torch.rand(1000, generator=torch.Generator().manual_seed(1)) * 4
    nll = nll_base + 0.01
    dp = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 0.02
    mine = printout(llama_statistics(kl, nll, nll_base, dp, torch.rand(1000) < 0.97), perplexities(nll, nll_base))
    assert len(mine) == len(tool)
    for ours, theirs in zip(mine, tool):
        label = theirs.split(":")[0] if not theirs.startswith("Cor") else "Cor(ln(PPL(Q)), ln(PPL(base)))"
        assert ours.startswith(label), (ours, theirs)
        assert len(ours) == len(theirs), (ours, theirs)  # the same field widths
    with pytest.raises(ValueError, match="Perplexity statistics"):
        printed("no statistics here")
