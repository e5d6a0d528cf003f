from quantlab.measurements.timing_noise import NOISY_BANDWIDTH_CHANGE, NOISY_P90_OVER_P10, Noise

QUIET = {"decode_ms_p10": 40.0, "decode_ms_p90": 44.0, "memory_bandwidth_bytes_per_s": 10**10,
         "memory_bandwidth_after_bytes_per_s": 10**10}


def test_a_quiet_row_is_not_flagged() -> None:
    out = Noise().derive(QUIET)
    assert not out.noisy and out.timing_noise == "" and out.decode_p90_over_p10 == 1.1


def test_a_wide_spread_of_steps_is_flagged() -> None:
    out = Noise().derive({**QUIET, "decode_ms_p10": 42.0, "decode_ms_p90": 699.0})  # the contended bf16 row
    assert out.noisy and out.decode_p90_over_p10 > NOISY_P90_OVER_P10 and "p90/p10 16.6" in out.timing_noise


def test_a_bandwidth_that_changed_while_the_variant_ran_is_flagged() -> None:
    after = int(10**10 * (1 - NOISY_BANDWIDTH_CHANGE - 0.05))
    out = Noise().derive({**QUIET, "memory_bandwidth_after_bytes_per_s": after})
    assert out.noisy and "bandwidth changed 30%" in out.timing_noise
    assert not Noise().derive({**QUIET, "memory_bandwidth_after_bytes_per_s": int(10**10 * 0.9)}).noisy


def test_no_flag_without_timings() -> None:
    assert Noise().derive({"memory_bandwidth_bytes_per_s": 1}) is None
