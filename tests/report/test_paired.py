"""Paired comparisons along the divergence front: neighbours on the front of mean KL against bytes are compared over
their shared windows, a real gap is called distinguishable, a noise-level one is not, and the reports say so."""
import numpy as np
import pandas as pd

from quantlab.report.paired import floor_lines, front_neighbours, paired_lines

RNG = np.random.default_rng(0)
HARD = RNG.exponential(0.02, 32)  # the windows' own difficulty, shared by every variant


def _row(variant: str, weight_bytes: int, kl_shift: float, noise: float = 1e-5) -> dict:
    kl = HARD * (1 + kl_shift) + RNG.normal(0, noise, 32)
    return {"variant": variant, "status": "ok", "weight_bytes": weight_bytes, "kl_divergence_mean": float(kl.mean()),
            "divergence_windows": {"kl_mean": kl.tolist(), "nll_mean": (2.0 + kl).tolist()}}


def test_front_neighbours_are_compared_and_a_noise_level_gap_is_not_distinguishable() -> None:
    rows = [_row("int2", 100, 3.0), _row("int4", 200, 1.0, 2e-3), _row("int4-dearer", 300, 0.99, 2e-3),
            _row("int8", 400, 0.1)]
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "divergence_windows"} for r in rows])
    found = {p.variant: p for p in front_neighbours(frame, rows)}
    assert set(found) == {"int4", "int4-dearer", "int8"} and found["int4"].neighbour == "int2"
    assert found["int4"].distinguishable and found["int4"].kl["high"] < 0  # int4 diverges less than int2
    assert not found["int4-dearer"].distinguishable  # 1% of KL apart under window-level noise twice as large
    assert found["int8"].distinguishable
    lines = paired_lines(frame, rows)
    assert lines[0].startswith("Paired bootstrap over the 32 windows")
    assert any("int4-dearer against int4" in line and "not distinguishable" in line for line in lines)


def test_rows_without_per_window_figures_are_left_out() -> None:
    rows = [_row("a", 100, 1.0), {**_row("b", 200, 0.5), "divergence_windows": None}]
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "divergence_windows"} for r in rows])
    assert front_neighbours(frame, rows) == [] and paired_lines(frame, rows) == []


def test_the_floor_names_the_variants_whose_kl_interval_reaches_it() -> None:
    floor = {"path": "the baseline computed in bfloat16 against itself in float32", "kl_mean": 1e-5,
             "kl_mean_uncertainty": 1e-6, "kl_p99": 1e-4, "same_top_p_percent": 99.9, "delta_p_rms_percent": 0.01}
    rows = [{"variant": "fp32", "status": "ok", "kl_divergence_mean": 0.0, "noise_floor": floor},
            {"variant": "int8", "status": "ok", "kl_divergence_mean": 1.5e-5, "kl_divergence_mean_uncertainty": 2e-6},
            {"variant": "int4", "status": "ok", "kl_divergence_mean": 3e-3, "kl_divergence_mean_uncertainty": 1e-4},
            {"variant": "old", "status": "ok", "kl_divergence_mean": 1e-5}]  # a record without the uncertainty
    (line,) = floor_lines(rows)
    assert line.startswith("Noise floor, the baseline computed in bfloat16") and "0.000010 ± 0.000001" in line
    assert line.endswith("Not distinguishable from the baseline (mean KL within 1.96σ of the floor's): int8, old.")
    assert floor_lines(rows[1:]) == []


def test_the_kl_distribution_plot_draws_each_variant_and_the_floor() -> None:
    from quantlab.report.plots import kl_distribution_plot

    q = {"max": 0.5, "99.9": 0.2, "99.0": 0.05, "95.0": 0.02, "90.0": 0.01, "median": 0.002, "10.0": 1e-4,
         "5.0": 5e-5, "1.0": 1e-5, "0.1": 1e-6, "min": 0.0}
    floor = {"path": "the baseline computed in bfloat16 against itself in float32", "kl_mean": 1e-4,
             "kl_mean_uncertainty": 1e-6, "kl_p99": 1e-3, "same_top_p_percent": 99.0, "delta_p_rms_percent": 0.1}
    rows = [{"variant": "fp32", "status": "ok", "kl_divergence_mean": 0.0, "noise_floor": floor,
             "kl_divergence_quantiles": {k: 0.0 for k in q}},
            {"variant": "int4", "status": "ok", "kl_divergence_mean": 0.01, "kl_divergence_quantiles": q}]
    svg = kl_distribution_plot(rows)
    assert svg is not None and svg.startswith("<svg")
    assert 'id="kl-int4"' in svg and 'id="noise-floor"' in svg
    assert 'id="kl-fp32"' not in svg  # the baseline against itself has no KL to draw
    assert kl_distribution_plot([{**rows[1], "kl_divergence_quantiles": None}]) is None


def test_any_two_variants_are_compared_and_missing_figures_are_one_line_errors() -> None:
    import pytest

    from quantlab.errors import QuantlabError
    from quantlab.report.paired import paired_between

    rows = [_row("int2", 100, 3.0), _row("int8", 400, 0.1), {**_row("old", 300, 0.5), "divergence_windows": None}]
    got = paired_between(rows, "int2", "int8")
    assert got.kl["difference"] > 0 and got.distinguishable and got.text().startswith("int2 against int8: mean KL +")
    with pytest.raises(QuantlabError, match="no measured variant 'int3' in this run"):
        paired_between(rows, "int3", "int8")
    with pytest.raises(QuantlabError, match="old: its record holds no per-window divergence figures"):
        paired_between(rows, "old", "int8")
