"""benchmarks/vs_llamacpp.py's bookkeeping: which llama.cpp row a quantlab row is compared with, which ratios the
CPU-speed targets bound, and how one invocation becomes one child per thread count."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_llamacpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_llamacpp"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("vs_llamacpp", None)


def test_pairing_takes_own_type_and_cache_width(bench):
    S = bench.System
    llamas = [S("llama.cpp", t, c) for t in ("Q4_K_M", "Q4_0") for c in ("f16", "q8_0", "q4_0")]
    assert bench.paired_llama(S("quantlab", "gguf-q4_0", "native"), llamas) == S("llama.cpp", "Q4_0", "f16")
    assert bench.paired_llama(S("quantlab", "int4-g32", "int8"), llamas) == S("llama.cpp", "Q4_K_M", "q8_0")
    assert bench.paired_llama(S("quantlab", "nf4", "int4"), llamas) == S("llama.cpp", "Q4_K_M", "q4_0")
    # a type or cache llama.cpp does not run falls back to the first of each
    assert bench.paired_llama(S("quantlab", "gguf-iq4_nl", "int2-kivi"), [S("llama.cpp", "Q4_1", "f16")]) == \
        S("llama.cpp", "Q4_1", "f16")


def test_targets_are_the_bounded_ratios_present(bench):
    S = bench.System
    medians = {S("llama.cpp", "Q4_K_M", "f16"): 10.0, S("quantlab", "gguf-q4_k_m", "native"): 12.0,
               S("quantlab", "int4-g32", "native"): 10.0, S("quantlab", "nf4", "native"): 11.0,
               S("quantlab", "fp8", "native"): 13.0, S("quantlab", "int3-g128", "native"): 13.0}
    got = {(s.weights, ref.label): (round(ratio, 6), bound) for s, ref, ratio, bound in bench.targets(medians, 128)}
    assert got == {("gguf-q4_k_m", "llama.cpp Q4_K_M (KV f16)"): (1.2, 1.1),
                   ("nf4", "quantlab int4-g32"): (1.1, 1.15),
                   ("int3-g128", "quantlab int4-g32"): (1.3, 1.2)}  # fp8's int8 row is absent: no ratio


def test_long_context_targets_pair_caches_with_llama_cpp(bench):
    S = bench.System
    medians = {S("llama.cpp", "Q4_1", c): m for c, m in (("f16", 16.0), ("q8_0", 20.0), ("q4_0", 32.0))}
    medians.update({S("quantlab", "int4-g32", kv): m for kv, m in (("native", 20.0), ("int8", 21.0), ("int4", 24.0))})
    got = {(s.label, ref.label): (round(ratio, 6), bound) for s, ref, ratio, bound in bench.targets(medians, 4096)}
    assert got == {
        ("quantlab int4-g32", "llama.cpp Q4_1 (KV f16)"): (1.25, 1.1),
        ("quantlab int4-g32 + KV int8", "quantlab int4-g32"): (1.05, 1.05),
        ("quantlab int4-g32 + KV int8", "llama.cpp Q4_1 (KV q8_0)"): (1.05, 1.0),
        ("quantlab int4-g32 + KV int4", "quantlab int4-g32"): (1.2, 1.15),
        ("quantlab int4-g32 + KV int4", "llama.cpp Q4_1 (KV q4_0)"): (0.75, 1.0),
    }
    # a GGUF type is held to llama.cpp's step on the same blocks with the caches at full precision only
    gguf = {S("llama.cpp", "Q4_0", "q8_0"): 10.0, S("quantlab", "gguf-q4_0", "int8"): 12.0}
    assert not bench.targets(gguf, 128)
    # below 512 positions the caches' comparison with llama.cpp has no bound, so it is not listed
    assert not [t for t in bench.targets(medians, 128) if t[1].kind == "llama.cpp"]


def test_children_get_one_thread_count_each(bench):
    argv = ["--variants", "forms", "--threads", "1", "2", "--rounds", "3", "--json=x.json"]
    assert bench.without(bench.without(argv, "--threads"), "--json") == ["--variants", "forms", "--rounds", "3"]
    assert bench.thread_counts(["1", "2"]) == [1, 2]
    assert bench.thread_counts(None) == []
    assert bench.thread_counts(["all"])[0] == 1
    with pytest.raises(SystemExit, match="--threads"):
        bench.thread_counts(["two"])


def test_every_suite_comparison_parses(bench):
    for name, comparisons in bench.SUITES.items():
        for extra in comparisons:
            args = bench.parser().parse_args(extra)
            assert all(v in bench.VARIANTS or v == "forms" for v in args.variants), (name, extra)


def test_each_cache_gets_a_model_of_its_own(bench):
    """Engines open together must not share a model: each sets its attention and its linears on it."""
    models = {"int4-g32": [1], "int8": [2]}
    got = bench.engine_models(models, ["native", "int8", "int4"])
    assert list(got) == [(w, kv) for w in models for kv in ("native", "int8", "int4")]
    for w, m in models.items():
        copies = [got[(w, kv)] for kv in ("native", "int8", "int4")]
        assert copies[0] is m and all(c == m for c in copies)
        assert len({id(c) for c in copies}) == 3


def test_a_failed_suite_comparison_is_named_and_the_rest_still_run(bench, monkeypatch, capsys):
    import subprocess

    ran: list[list[str]] = []

    def per_thread_count(argv, counts):
        ran.append(argv)
        if len(ran) == 1:
            raise subprocess.CalledProcessError(1, ["vs_llamacpp.py"])
        return []

    monkeypatch.setattr(bench, "llama_cpp_available", lambda: True)
    monkeypatch.setattr(bench, "per_thread_count", per_thread_count)
    monkeypatch.setattr(bench, "print_summary", lambda results: None)
    assert bench.main(["--suite", "targets"]) == 1
    assert len(ran) == len(bench.SUITES["targets"])
    out = capsys.readouterr().out
    first = " ".join(bench.SUITES["targets"][0])
    assert f"failed: vs_llamacpp.py {first} (exit status 1)" in out and out.count("failed:") == 1


def test_each_round_starts_one_system_later(bench):
    systems = [bench.System("llama.cpp", "Q4_0", "f16"), bench.System("quantlab", "int4-g32", "native"),
               bench.System("quantlab", "nvfp4", "native")]
    orders = [bench.round_order(systems, i) for i in range(3)]
    assert [o[0] for o in orders] == systems and [o[-1] for o in orders] == [systems[2], systems[0], systems[1]]
    assert all(sorted(o, key=systems.index) == systems for o in orders)
    assert bench.round_order(systems, 3) == systems
