import pytest
import torch

from conftest import make_llama
from quantlab import KV_FORMATS
from quantlab.measure.latency import measure_decode

CPU = torch.device("cpu")


@pytest.mark.parametrize("kv,cache_class", [(KV_FORMATS["native"].build(), "DynamicCache"),
                                            (KV_FORMATS["int4"].build(group_size=32, residual_tokens=8), "Cache")])
def test_decode_record_names_the_cache_it_used_and_keeps_every_step(kv, cache_class: str) -> None:
    model = make_llama()
    result = measure_decode(model, kv, batch_size=2, prompt_tokens=16, new_tokens=6, warmup_runs=1,
                            prefill_repeats=2, seed=0, device=CPU)
    record = result.record(2)
    assert record["engine"] == "eager" and record["engine_options"] == {"cache": cache_class, "compiled": False}
    assert len(record["decode_ms_samples"]) == record["decode_steps"] == 6
    assert record["decode_ms_p10"] <= record["decode_ms_per_token"] <= record["decode_ms_p90"]
    assert record["tokens_per_s"] == pytest.approx(2 * 1000 / record["decode_ms_per_token"], rel=1e-3)
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"] and record["kv_cache_tokens"] == 22
