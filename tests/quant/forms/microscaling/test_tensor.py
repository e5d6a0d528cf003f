"""The microscaling stored forms: packing, byte counts, the grids they decode to, and the error each keeps."""
from __future__ import annotations

import pytest
import torch

from quantlab import quantize_
from quantlab.errors import UnsupportedError
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.forms.microscaling import MXTensor, NVFP4Tensor, quantize_mx, quantize_nvfp4
from quantlab.quant.forms.microscaling.quantize import e2m1_codes
from quantlab.quant.forms.microscaling.tensor import (
    E2M1_VALUES,
    e2m1_table,
    e8m0_to_float,
    pack_nibbles,
    unpack_nibbles,
)


def test_nibbles_round_trip_with_the_even_column_low() -> None:
    codes = torch.randint(0, 16, (6, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (6, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_nibbles(packed), codes)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 1] << 4)


def test_every_e2m1_value_encodes_to_its_own_code_and_midpoints_tie_to_even() -> None:
    table = e2m1_table()
    values = torch.tensor(E2M1_VALUES)
    assert torch.equal(table[e2m1_codes(values).long()], values)
    assert torch.equal(table[e2m1_codes(-values[1:]).long()], -values[1:])
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert table[e2m1_codes(midpoints).long()].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert table[e2m1_codes(midpoints, "to_zero").long()].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert e2m1_codes(torch.tensor([-0.1])).item() == 8 and e2m1_codes(torch.tensor([-0.1]), "to_zero").item() == 0
    assert table[e2m1_codes(torch.tensor([7.0, -100.0])).long()].tolist() == [6.0, -6.0]  # saturates


def test_e8m0_decodes_powers_of_two() -> None:
    assert e8m0_to_float(torch.tensor([127, 128, 100, 0], dtype=torch.uint8)).tolist() == [1.0, 2.0, 2.0 ** -27,
                                                                                         2.0 ** -127]
    assert torch.isnan(e8m0_to_float(torch.tensor([255], dtype=torch.uint8))).all()


@pytest.mark.parametrize("element,bits", [("e2m1", 4.25), ("e4m3", 8.25)])
def test_mx_holds_the_bytes_of_its_formula(element: str, bits: float) -> None:
    q = quantize_mx(torch.randn(96, 256), element)
    assert q.nbytes == q.layout_nbytes() == MXTensor.analytic_nbytes((96, 256), element)
    assert q.bits_per_weight == bits


def test_nvfp4_holds_the_bytes_of_its_formula() -> None:
    q = quantize_nvfp4(torch.randn(96, 256))
    assert q.nbytes == q.layout_nbytes() == NVFP4Tensor.analytic_nbytes((96, 256)) == 96 * 128 + 96 * 16 + 4
    assert q.bits_per_weight == pytest.approx(4.5 + 32 / (96 * 256))  # the global scale: 4 bytes a tensor


def test_each_block_decodes_within_half_a_step_of_its_largest_element() -> None:
    w = torch.randn(64, 256)
    for q, block, top in ((quantize_mx(w, "e2m1"), 32, 6.0), (quantize_nvfp4(w), 16, 6.0)):
        err = (q.dequantize() - w).abs().view(64, -1, block)
        scale = (q.dequantize().abs().view(64, -1, block).amax(-1, keepdim=True) / top).clamp(min=1e-12)
        assert (err <= 2 * scale + 1e-6).all()  # the widest e2m1 step is 2 (between 4 and 6)


def test_finer_forms_err_less_on_the_same_weight() -> None:
    w = torch.distributions.StudentT(3.0).sample((128, 512))
    mse = {name: (q.dequantize() - w).pow(2).mean().item() for name, q in (
        ("mxfp4", quantize_mx(w, "e2m1")), ("nvfp4", quantize_nvfp4(w)), ("mxfp8", quantize_mx(w, "e4m3")))}
    assert mse["mxfp8"] < mse["nvfp4"] < mse["mxfp4"]


def test_a_width_that_is_not_whole_blocks_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="divisible by 32"):
        quantize_mx(torch.randn(4, 48))
    with pytest.raises(UnsupportedError, match="divisible by 16"):
        quantize_nvfp4(torch.randn(4, 24))


def test_a_model_in_each_form_holds_packed_bytes_and_stays_close_to_its_logits() -> None:
    from conftest import make_llama

    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    base = make_llama().eval()
    with torch.no_grad():
        ref = base(ids).logits
    for name in ("mxfp8", "nvfp4", "mxfp4"):
        model = make_llama().eval()
        report = quantize_(model, WEIGHT_FORMATS[name].build())
        with torch.no_grad():
            out = model(ids).logits
        assert report.replaced
        rel = ((out - ref).norm() / ref.norm()).item()
        assert rel < (0.05 if name == "mxfp8" else 0.3), (name, rel)
