import pytest
import torch

from conftest import make_llama
from quantlab.engine.decode import measure_decode
from quantlab.engine.device import timed_ms
from quantlab.extend import KV_FORMATS

CPU = torch.device("cpu")


@pytest.mark.parametrize("kv,cache_class", [(KV_FORMATS["native"].build(), "DynamicCache"),
                                            (KV_FORMATS["int4"].build(group_size=32, residual_tokens=8), "Cache")])
def test_decode_record_names_the_cache_it_used_and_keeps_every_step(kv, cache_class: str) -> None:
    model = make_llama()
    result = measure_decode(model, kv, batch_size=2, prompt_tokens=16, new_tokens=6, warmup_runs=1,
                            prefill_repeats=2, seed=0, device=CPU)
    record = result.record(2)
    assert record["engine"] == "eager" and record["engine_options"] == {"cache": cache_class, "compiled": False,
                                                                        "attention": "quantlab"}
    assert len(record["decode_ms_samples"]) == record["decode_steps"] == 6
    assert record["decode_ms_p10"] <= record["decode_ms_per_token"] <= record["decode_ms_p90"]
    assert record["tokens_per_s"] == pytest.approx(2 * 1000 / record["decode_ms_per_token"], rel=1e-3)
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"] and record["kv_cache_tokens"] == 22


@pytest.mark.gpu
def test_cuda_events_time_the_work_on_the_stream_not_the_launch() -> None:
    dev = torch.device("cuda")
    # 50M cycles: over 15 ms at any clock below 3 GHz, while the launch itself returns in microseconds.
    _, ms = timed_ms(lambda: torch.cuda._sleep(50_000_000), dev)
    assert ms > 10


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["eager", "compiled"])
def test_cuda_decode_records_allocator_peaks_and_the_engine(engine: str) -> None:
    dev = torch.device("cuda")
    model = make_llama().to(dev, torch.bfloat16)
    result = measure_decode(model, KV_FORMATS["native"].build(), batch_size=1, prompt_tokens=16, new_tokens=8,
                            warmup_runs=1, prefill_repeats=2, seed=0, device=dev, engine=engine)
    record = result.record(1)
    assert record["decode_steps"] == 8 and record["prefill_ms"] > 0
    assert record["peak_reserved_bytes"] >= record["peak_memory_bytes"] > 0
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"]
    if engine == "compiled":
        assert record["engine_options"]["mode"] == "reduce-overhead"
        assert record["engine_options"]["inductor"]["coordinate_descent_tuning"] is True
