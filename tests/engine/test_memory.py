import pytest
import torch

from quantlab import quantize_
from quantlab.engine.memory import PeakMemory, weight_bytes, weight_bytes_analytic, weight_bytes_by_component
from quantlab.extend import WEIGHT_FORMATS
from tests.conftest import make_llama


def test_fp32_weight_bytes_count_tied_embeddings_once() -> None:
    model = make_llama()
    unique = {p.data_ptr(): p for p in model.parameters()}
    params = sum(p.numel() for p in unique.values())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert weight_bytes(model) == 4 * params + buffers
    assert weight_bytes_analytic(model) == weight_bytes(model)


def test_quantized_bytes_match_the_analytic_formula_and_order() -> None:
    sizes = {}
    for name, params in [("fp32", {}), ("bf16", {}), ("int8", {}), ("int4", {"group_size": 128})]:
        model = make_llama()
        quantize_(model, WEIGHT_FORMATS[name].build(**params))
        assert weight_bytes(model) == weight_bytes_analytic(model)
        sizes[name] = weight_bytes_by_component(model)
    linear = {k: v["quantized_linear"] or v["linear"] for k, v in sizes.items()}
    assert linear["fp32"] == 2 * linear["bf16"]
    assert linear["bf16"] > 1.8 * linear["int8"] > 1.8 * 1.8 * linear["int4"]


def test_peak_memory_sees_a_torch_allocation_on_cpu() -> None:
    peak = PeakMemory(torch.device("cpu"))
    with peak.track():
        base = PeakMemory(torch.device("cpu"))
    baseline = base.peak_bytes or peak.peak_bytes
    with peak.track():
        x = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
        del x
    assert peak.peak_bytes - baseline >= 60 << 20
    assert "RSS" in peak.method


@pytest.mark.gpu
def test_cuda_peak_is_the_allocators_and_sees_a_freed_allocation() -> None:
    dev = torch.device("cuda")
    x = torch.ones(16 << 20, dtype=torch.uint8, device=dev)  # held across the phase: part of the peak
    held = torch.cuda.memory_allocated(dev)
    peak = PeakMemory(dev)
    with peak.track():
        y = torch.ones(64 << 20, dtype=torch.uint8, device=dev)
        del y
    assert held + (64 << 20) <= peak.peak_bytes <= peak.reserved_bytes
    assert "max_memory_allocated" in peak.method and "context excluded" in peak.method
    del x


def test_decode_reads_a_tied_embedding_table_but_not_an_untied_one() -> None:
    from quantlab.engine.memory import decode_weight_bytes_read

    tied, untied = make_llama(), make_llama(tie_word_embeddings=False)
    table = 4096 * 128 * 4
    assert decode_weight_bytes_read(tied) == weight_bytes(tied)
    assert decode_weight_bytes_read(untied) == weight_bytes(untied) - table
