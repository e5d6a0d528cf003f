import pytest
import torch

from conftest import make_llama, rel_error
from quantlab import quantize_
from quantlab.errors import UnsupportedError
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.forms.codebook.tensor import CODEBOOKS, CodebookTensor, dynamic_map, quantize_codebook
from quantlab.quant.kernels.base import DequantKernel, choose_kernel

CPU = torch.device("cpu")


def _weight(out: int = 96, n_in: int = 576) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def test_each_value_takes_the_nearest_codebook_entry_of_its_block() -> None:
    w = _weight(8, 100)  # 800 values: blocks of 64 cross rows, and the last block is short (32)
    q = quantize_codebook(w, "nf4", 64)
    flat = w.reshape(-1)
    absmax = torch.nn.functional.pad(flat.abs(), (0, 32)).reshape(-1, 64).amax(1)
    assert torch.equal(q.absmax, absmax)
    scaled = flat / absmax.repeat_interleave(64)[:800]
    distance = (scaled[:, None] - torch.tensor(CODEBOOKS["nf4"])).abs()
    chosen = distance.gather(1, q.codes().reshape(-1, 1).long()).squeeze(1)
    assert torch.allclose(chosen, distance.amin(1), atol=1e-7)  # no entry is nearer
    assert rel_error(q.dequantize(), w) < 0.12


@pytest.mark.parametrize("codebook", ["nf4", "fp4"])
@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_numerics_equal_bitsandbytes(codebook: str, double_quant: bool, dtype: torch.dtype) -> None:
    bnb = pytest.importorskip("bitsandbytes.functional")
    w = _weight().to(dtype)
    packed, state = bnb.quantize_4bit(w, blocksize=64, compress_statistics=double_quant, quant_type=codebook)
    q = quantize_codebook(w, codebook, 64, double_quant)
    theirs = torch.stack([packed.view(-1) >> 4, packed.view(-1) & 15], 1).reshape(96, 576)  # high nibble first
    assert torch.equal(q.codes(), theirs)
    reference = bnb.dequantize_4bit(packed, state)
    if not double_quant:
        assert torch.equal(q.absmax, state.absmax)
        assert torch.equal(q.dequantize(dtype), reference)
        return
    # The 8-bit block maxima: bitsandbytes' CPU search and the midpoint rule may part on a tie (one step).
    steps = (q.absmax.int() - state.absmax.int()).abs()
    assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01
    assert torch.equal(q.absmax_scale, state.state2.absmax) and torch.allclose(q.absmax_offset, state.offset.reshape(1))
    their_maxima = bnb.dequantize_blockwise(state.absmax, state.state2) + state.offset
    assert rel_error(q.block_maxima(), their_maxima) < 1e-3
    assert rel_error(q.dequantize(dtype), reference) < 1e-3


def test_the_dynamic_map_is_bitsandbytes() -> None:
    bnb = pytest.importorskip("bitsandbytes.functional")
    assert torch.equal(dynamic_map(), bnb.create_dynamic_map(signed=True))
    for name in CODEBOOKS:
        assert torch.allclose(torch.tensor(CODEBOOKS[name]), bnb.get_4bit_type(name, device="cpu"))


@pytest.mark.parametrize("double_quant,bits_per_weight", [(False, 4.5), (True, 4 + 8 / 64 + 32 / (64 * 256))])
def test_bytes_held_match_the_formula(double_quant: bool, bits_per_weight: float) -> None:
    q = quantize_codebook(_weight(256, 1024), "nf4", 64, double_quant)
    assert q.nbytes == q.layout_nbytes() == CodebookTensor.analytic_nbytes((256, 1024), 64, double_quant)
    assert q.bits_per_weight == pytest.approx(bits_per_weight, abs=0.01)


def test_the_class_survives_moves_row_ranges_and_the_kernel() -> None:
    q = quantize_codebook(_weight(), "fp4", 128, double_quant=True)
    moved = q.to("cpu")
    assert type(moved) is CodebookTensor and moved.codebook == "fp4"
    assert torch.equal(q.dequantize(rows=slice(10, 30)), q.dequantize()[10:30])
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert isinstance(kernel, DequantKernel) and type(kernel.qtensor) is CodebookTensor
    assert sum(t.numel() * t.element_size() for t in kernel.buffers()) == kernel.analytic_nbytes() == q.nbytes
    kernel.cpu_block_elements = 7 * 576  # row blocks that cut across absmax blocks
    x = torch.randn(3, 576)
    assert rel_error(kernel(x), x @ q.dequantize().T) < 1e-6
    with pytest.raises(UnsupportedError, match="does not support"):
        choose_kernel(q, CPU, torch.bfloat16, ["int4pack_mm_cpu"])


def test_nf4_on_a_model_beats_fp4_and_keeps_the_label() -> None:
    errors = {}
    for name in ("nf4", "fp4"):
        model = make_llama()
        reference = make_llama()
        fmt = WEIGHT_FORMATS[name].build(double_quant=True)
        report = quantize_(model, fmt)
        assert len(report.replaced) == 14 and fmt.label == f"{name}-b64-dq"
        ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            errors[name] = rel_error(model(ids).logits, reference(ids).logits)
    assert errors["nf4"] < errors["fp4"]  # normal-quantile levels suit normal weights (make_llama's init)


def test_bad_block_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="block_size must be one of"):
        WEIGHT_FORMATS["nf4"].build(block_size=48)
    with pytest.raises(UnsupportedError, match="block_size"):
        quantize_codebook(_weight(), "nf4", 48)
