import pytest
import torch

from quantlab.engine.bandwidth import copy_bandwidth_bytes_per_s
from quantlab.measurements.roofline import Roofline


def test_roofline_share_from_the_rows_own_bytes_and_bandwidth() -> None:
    row = {"decode_ms_per_token": 2.0, "decode_weight_bytes_read": 1_000_000, "kv_cache_bytes": 40_000,
           "kv_cache_tokens": 40, "decode_steps": 20, "prompt_tokens": 20, "memory_bandwidth_bytes_per_s": 10**9}
    out = Roofline().derive(row)  # 1 GB/s: 1 MB of weights + 30 positions x 1 kB of cache = 1.03 ms
    assert out.decode_bytes_read_per_step == 1_030_000
    assert out.roofline_decode_ms == pytest.approx(1.03) and out.roofline_share == pytest.approx(0.515)
    half = Roofline().derive({**row, "memory_bandwidth_bytes_per_s": 5 * 10**8})
    assert half.roofline_share == pytest.approx(2 * out.roofline_share)


def test_no_roofline_without_its_inputs() -> None:
    assert Roofline().derive({"decode_ms_per_token": 2.0, "decode_steps": 20, "prompt_tokens": 20}) is None


def test_the_copy_benchmark_measures_a_plausible_bandwidth() -> None:
    assert copy_bandwidth_bytes_per_s(torch.device("cpu"), nbytes=16 << 20) > 1e8
