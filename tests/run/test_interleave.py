"""Timing the measured variants again together (``--retime all --rounds N``): each round every variant once, the
order rotating; the steps pooled; only the timing figures replaced; a failing variant dropped, the others kept."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from quantlab.engine import DecodeResult
from quantlab.errors import QuantlabError
from quantlab.records.folder import RunFolder
from quantlab.report import load_rows
from quantlab.run import interleave
from quantlab.run.recipe import validate_recipe
from quantlab.run.runner import run_recipe

WORKLOAD = {"prompt_tokens": [8, 16], "new_tokens": 4, "warmup_runs": 1, "prefill_repeats": 1, "engine": "eager"}


def _result(prefill: float, steps: list[float], **machine: Any) -> DecodeResult:
    return DecodeResult(prefill, steps, {"peak_memory_bytes": 1}, "eager", {}, machine)


def test_pooled_rounds_keep_every_step_the_median_prefill_and_the_worst_machine() -> None:
    rounds = [_result(5.0, [1.0, 2.0], threads=2, load_average_1m=0.5, process_cpu_share=0.9, concurrent_timed_runs=0),
              _result(9.0, [3.0], threads=2, load_average_1m=2.5, process_cpu_share=0.95, concurrent_timed_runs=0),
              _result(7.0, [4.0, 5.0], threads=2, load_average_1m=1.0, process_cpu_share=0.4, concurrent_timed_runs=1)]
    pooled = DecodeResult.pooled(rounds, interleaved_variants=4)
    assert pooled.decode_ms == [1.0, 2.0, 3.0, 4.0, 5.0] and pooled.prefill_ms == 7.0
    assert pooled.machine == {"threads": 2, "load_average_1m": 2.5, "process_cpu_share": 0.4, "concurrent_timed_runs": 1}
    record = pooled.record(batch_size=1)
    assert record["decode_ms_per_token"] == 3.0 and record["decode_steps"] == 5
    assert record["timing_rounds"] == 3 and record["timing_interleaved_variants"] == 4
    assert "timing_rounds" not in rounds[0].record(batch_size=1)  # one generation alone says nothing of rounds


class _Variant:
    def __init__(self, label: str) -> None:
        self.label = label


class _Context:
    """A variant's lifecycle as ``_time_point`` uses it, recording when each of its rounds ran."""

    def __init__(self, label: str, calls: list[str], fail_in_round: int | None = None) -> None:
        self.variant, self.calls, self.fail_in_round = _Variant(label), calls, fail_in_round
        self.pooled: dict[tuple[int, int], DecodeResult] = {}
        self.entered = self.exited = 0

    @contextlib.contextmanager
    def decode_rounds(self, batch: int, prompt: int) -> Iterator[Any]:
        self.entered += 1
        done = 0

        def timed() -> DecodeResult:
            nonlocal done
            done += 1
            if done == self.fail_in_round:
                raise RuntimeError("out of memory")
            self.calls.append(self.variant.label)
            return _result(float(done), [float(done)] * 2)

        try:
            yield timed
        finally:
            self.exited += 1

    def set_generation(self, batch: int, prompt: int, result: DecodeResult) -> None:
        self.pooled[(batch, prompt)] = result


def test_each_round_times_every_variant_once_in_rotating_order() -> None:
    calls: list[str] = []
    contexts = {k: (_Context(k, calls), {}) for k in "abc"}
    interleave._time_point(contexts, (1, 8), 3, lambda _: None)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each first once, each once a round
    for ctx, _ in contexts.values():
        pooled = ctx.pooled[(1, 8)]
        assert pooled.rounds == 3 and pooled.interleaved_variants == 3 and len(pooled.decode_ms) == 6
        assert ctx.entered == ctx.exited == 1  # made ready once for all rounds, released after them


def test_a_variant_failing_in_a_round_is_dropped_and_the_others_go_on() -> None:
    calls: list[str] = []
    contexts = {k: (_Context(k, calls, fail_in_round=2 if k == "b" else None), {}) for k in "abc"}
    lines: list[str] = []
    interleave._time_point(contexts, (1, 8), 3, lines.append)
    assert set(contexts) == {"a", "c"} and calls.count("b") == 1
    assert any("b: failed in round 2 (RuntimeError: out of memory); its earlier timing stays" in ln for ln in lines)
    assert all(ctx.pooled[(1, 8)].interleaved_variants == 2 for ctx, _ in contexts.values())


def test_variants_that_would_not_fit_together_are_refused_before_loading() -> None:
    records = [{"measurements": {"weights": {"weight_bytes": 3 * 2**30}}}] * 3
    with pytest.raises(QuantlabError, match=r"--rounds 5: the 3 variants to time together hold 9.00 GiB .*--rounds 1"):
        interleave.check_memory(records, 2**30, 5, available=8 * 2**30)
    interleave.check_memory(records, 2**30, 5, available=16 * 2**30)
    interleave.check_memory(records, 2**30, 5, available=None)  # unknown: not refused


def _recipe() -> Any:
    return validate_recipe({"name": "together", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32", "int8"],
                            "workload": WORKLOAD, "isolation": "none", "device": "cpu",
                            "evaluations": {"perplexity": {"window_tokens": 64, "max_tokens": 128}}})


@pytest.mark.parametrize("options, message", [
    ({"rounds": 3}, "--rounds 3: times the folder's measured variants again, together; give --retime all"),
    ({"rounds": 0, "retime": "all"}, "--rounds: a number of rounds, at least 1"),
    ({"rounds": 3, "retime": "all", "shard": (0, 2)}, "--rounds 3: the variants are timed together in this process"),
])
def test_rounds_are_refused_in_one_line_where_they_cannot_apply(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(QuantlabError, match=message):
        run_recipe(_recipe(), tmp_path / "out", log=lambda _: None, **options)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_retime_in_rounds_replaces_only_the_timing_and_says_how_it_was_taken(tmp_path: Path) -> None:
    recipe = _recipe()
    out = run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    folder = RunFolder(out)
    elsewhere = folder.read_record(recipe.variants()[1].key)  # measured on another machine: its quality stands
    elsewhere.update(fingerprint_id="0" * 16, fingerprint={**elsewhere["fingerprint"], "host": "elsewhere"})
    folder.write_record(elsewhere)
    before = {v.key: folder.read_record(v.key) for v in recipe.variants()}
    lines: list[str] = []
    run_recipe(recipe, out, log=lines.append, retime="all", rounds=3)
    labels = [v.label for v in recipe.variants()]
    assert not any(ln.endswith(": running") for ln in lines), lines  # nothing measured again from scratch
    assert any("int8-pc-asym: measured on elsewhere, kept" in ln for ln in lines), lines
    assert sum("round 1/3 over 2 variants" in ln for ln in lines) == 2  # one set of rounds per decode point
    for variant in recipe.variants():
        old, new = before[variant.key], folder.read_record(variant.key)
        assert new["measurements"] == old["measurements"]  # quality and weight figures kept
        assert new["retimed"] == {"first_started_at": old["started_at"], "first_sweep": old["sweep"],
                                  "interleaved": {"rounds": 3, "variants": labels}}
        for p_old, p_new in zip(old["points"], new["points"]):
            latency = p_new["measurements"]["latency"]
            assert latency["timing_rounds"] == 3 and latency["timing_interleaved_variants"] == 2
            assert latency["decode_steps"] == 3 * WORKLOAD["new_tokens"]  # every round's steps pooled
            for name in ("peak_memory", "kv_cache"):  # measured with the variant alone: kept
                assert p_new["measurements"][name] == p_old["measurements"][name]
    rows, manifest = load_rows(out)
    from quantlab.measurements import MEASUREMENTS

    said = MEASUREMENTS["latency"].build().provenance(rows[0], rows, manifest)
    assert "Timed again interleaved (fp32, int8-pc-asym): 3 rounds" in said and "2 variants" in said
