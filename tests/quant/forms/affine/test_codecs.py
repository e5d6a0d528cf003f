"""The affine forms' GGUF codec: integer codes become ggml's legacy blocks, decoded by gguf-py (llama.cpp's reference
Python decoder) to quantlab's numbers exactly (symmetric) or within the float16 minimum (asymmetric)."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from quantlab import quantize_tensor  # noqa: E402
from quantlab.quant.codecs import codec_for  # noqa: E402
from quantlab.quant.forms.affine.float_zero import quantize_float_zero  # noqa: E402
from quantlab.quant.tensors.base import WeightTensor  # noqa: E402


def block_type(q: WeightTensor) -> tuple[str | None, str]:
    codec = codec_for("gguf", q.form)
    why = codec.refusal(q)
    return (None, why) if why else (codec.ggml_type(q), "")


def encode_blocks(q: WeightTensor, kind: str) -> np.ndarray:
    return codec_for("gguf", q.form).encode(q, kind)


def _weight() -> torch.Tensor:
    return torch.randn(16, 256, generator=torch.Generator().manual_seed(0)) * 0.05


@pytest.mark.parametrize("bits,group_size,symmetric,kind", [
    (4, 32, True, "Q4_0"), (4, 128, True, "Q4_0"), (4, None, True, "Q4_0"), (5, 64, True, "Q5_0"),
    (8, 32, True, "Q8_0"), (8, None, True, "Q8_0"),
])
def test_symmetric_codes_are_ggml_blocks_exactly(bits, group_size, symmetric, kind) -> None:
    q = quantize_tensor(_weight(), bits, group_size, symmetric)
    assert block_type(q) == (kind, "")
    blocks = encode_blocks(q, kind)
    block_bytes, block = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, kind)][::-1]
    assert blocks.shape == (16, 256 // block * block_bytes) and blocks.dtype == np.uint8
    decoded = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind))
    assert np.array_equal(decoded, q.dequantize(torch.float32).numpy())


@pytest.mark.parametrize("kind,make", [
    ("Q4_1", lambda w: quantize_tensor(w, 4, 32)), ("Q5_1", lambda w: quantize_tensor(w, 5, 64)),
    ("Q4_1", lambda w: quantize_float_zero(w, 4, 64, optimize=True)),
])
def test_asymmetric_codes_differ_only_by_the_float16_minimum(kind, make) -> None:
    q = make(_weight())
    assert block_type(q)[0] == kind
    decoded = gguf.quants.dequantize(encode_blocks(q, kind), getattr(gguf.GGMLQuantizationType, kind))
    ours = q.dequantize(torch.float32).numpy()
    # m = -z * d in float16: half an ulp of |m| <= (2^bits - 1) * d at most, under 1% of the group's step d.
    group = q.group_size or q.shape[1]
    step = q.row_scales().float().repeat_interleave(group, dim=1)[:, : q.shape[1]].numpy()
    in_steps = np.abs(decoded - ours) / step
    assert 0 < in_steps.max() <= ((1 << q.bits) - 1) * 2.0 ** -11 < 0.016


@pytest.mark.parametrize("make,why", [
    (lambda w: quantize_tensor(w, 3, 64), "3-bit"), (lambda w: quantize_tensor(w, 8, 32), "asymmetric"),
    (lambda w: quantize_tensor(w, 4, 16), "whole blocks of 32"),
])
def test_forms_without_a_ggml_type_are_refused(make, why) -> None:
    kind, reason = block_type(make(_weight()))
    assert kind is None and why in reason
