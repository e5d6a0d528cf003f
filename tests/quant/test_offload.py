"""A model placed by accelerate with part of its layers offloaded to disk: the same logits, perplexity and
quantization codes as the model loaded whole (CPU; the two-GPU placement runs the same code)."""
import pytest
import torch

from quantlab import UnsupportedError, quantize_
from quantlab.data import calibration_samples, load_text
from quantlab.engine.memory import weight_bytes_by_device
from quantlab.eval.perplexity import perplexity
from quantlab.eval.tokens import tokenize
from quantlab.extend import WEIGHT_FORMATS
from quantlab.models import ModelSpec, load_model
from quantlab.quant.linear import QuantizedLinear

CPU = torch.device("cpu")
OFFLOADED = ModelSpec(bundled="tiny-stdlib-llama", device_map="auto", max_memory={"cpu": "12MB"})
WHOLE = ModelSpec(bundled="tiny-stdlib-llama")


def _pair():
    return load_model(WHOLE), load_model(OFFLOADED)


def _ids(tokenizer) -> torch.Tensor:
    return tokenize(tokenizer, load_text("bundled-heldout"))[:2048]


def test_offloaded_layers_give_the_same_logits_and_perplexity() -> None:
    whole, placed = _pair()
    assert "disk" in set(placed.model.hf_device_map.values())  # the 12 MB cap pushed layers to disk
    ids = _ids(whole.tokenizer)
    with torch.no_grad():
        assert torch.equal(whole.model(ids[None, :64]).logits, placed.model(ids[None, :64]).logits)
    text = load_text("bundled-heldout")
    a = perplexity(whole.model, ids, text, protocol="windows", window_tokens=256, batch_size=4, device=CPU)
    b = perplexity(placed.model, ids, text, protocol="windows", window_tokens=256, batch_size=4, device=CPU)
    assert a["perplexity"] == b["perplexity"]
    held = weight_bytes_by_device(placed.model)
    assert held["offload:disk"] > 0 and held["cpu"] < 12 * 2**20 + held["offload:disk"]


def _codes(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    return {name: [b for b in m.kernel.buffers() if b is not None]
            for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}


@pytest.mark.parametrize("fmt", [WEIGHT_FORMATS["int4"].build(group_size=128),
                                 pytest.param(WEIGHT_FORMATS["gptq"].build(bits=4, group_size=128),
                                              marks=pytest.mark.slow)])  # a calibrated solve: CI's slow tier
def test_quantizing_an_offloaded_model_gives_the_same_codes(fmt) -> None:
    whole, placed = _pair()
    calibration = calibration_samples(_ids(whole.tokenizer), 8, 128, seed=0) if fmt.requires_calibration else None
    quantize_(whole.model, fmt, calibration)
    quantize_(placed.model, fmt, calibration)
    a, b = _codes(whole.model), _codes(placed.model)
    assert len(a) == 6 * 7 and a.keys() == b.keys()
    for name in a:
        assert all(torch.equal(x, y) for x, y in zip(a[name], b[name])), name
    ids = _ids(whole.tokenizer)[None, :64]
    with torch.no_grad():
        assert torch.allclose(whole.model(ids).logits, placed.model(ids).logits, atol=1e-5)
    # The quantized layers stay where they run; what still sits on disk is what was never quantized.
    assert weight_bytes_by_device(placed.model).get("offload:disk", 0) < weight_bytes_by_device(load_model(OFFLOADED).model)["offload:disk"]


def test_an_offloaded_model_is_not_cast_in_place() -> None:
    placed = load_model(OFFLOADED)
    with pytest.raises(UnsupportedError, match="load it in that dtype"):
        quantize_(placed.model, WEIGHT_FORMATS["bf16"].build())
    quantize_(placed.model, WEIGHT_FORMATS["fp32"].build())  # already float32: nothing to cast


@pytest.mark.gpu
def test_two_cuda_devices_hold_the_layers_and_agree_with_one() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    one = load_model(ModelSpec(bundled="tiny-stdlib-llama", dtype="bfloat16"), device="cuda:0").model
    two = load_model(ModelSpec(bundled="tiny-stdlib-llama", dtype="bfloat16", device_map="balanced",
                               max_memory={"0": "6MB", "1": "1GB"})).model
    assert {str(d) for d in two.hf_device_map.values()} >= {"0", "1"}
    fmt = WEIGHT_FORMATS["int4"].build(group_size=128, compute_dtype="bfloat16")
    quantize_(one, fmt)
    quantize_(two, fmt)
    held = weight_bytes_by_device(two)
    assert held.get("cuda:0", 0) > 0 and held.get("cuda:1", 0) > 0
    ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = one(ids.to("cuda:0")).logits.float().cpu(), two(ids.to("cuda:0")).logits.float().cpu()
    assert torch.allclose(a, b, atol=2e-2, rtol=0)
