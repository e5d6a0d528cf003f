import pytest
import torch

from quantlab import UnsupportedError, quantize_tensor
from quantlab.quant.forms.affine.tensor import QuantizedTensor


def _weight(out: int = 64, n_in: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("group_size", [None, 32, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_round_trip_within_half_a_step(bits: int, group_size: int | None, symmetric: bool) -> None:
    w = _weight()
    q = quantize_tensor(w, bits, group_size, symmetric)
    err = (q.dequantize() - w).abs().reshape(w.shape[0], q.n_groups, -1)
    half_step = q.scales.float().unsqueeze(-1) / 2
    assert (err <= half_step * (1 + 1e-5) + 1e-12).all()


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 128, False), (4, None, True), (3, 128, False), (8, None, False)])
def test_nbytes_matches_the_format_formula(bits: int, group_size: int | None, symmetric: bool) -> None:
    q = quantize_tensor(_weight(), bits, group_size, symmetric)
    assert q.nbytes == QuantizedTensor.analytic_nbytes((64, 256), bits, group_size, symmetric, 2)
    groups = 1 if group_size is None else 256 // group_size
    zeros = 0 if symmetric else 64 * -(-groups * bits // 8) if bits in (4, 8) else q.zeros.numel()
    assert q.nbytes == 64 * 256 * bits // 8 + 64 * groups * 2 + zeros


def test_int4_group128_is_about_4_and_a_quarter_bits_per_weight() -> None:
    q = quantize_tensor(_weight(256, 1024), 4, 128, False)
    # 4 bits + fp16 scale / 128 + 4-bit zero / 128
    assert q.bits_per_weight == pytest.approx(4 + 16 / 128 + 4 / 128)
    assert q.nbytes / (256 * 1024 * 2) < 0.3


def test_more_bits_less_error() -> None:
    w = _weight()
    errors = [(quantize_tensor(w, b, 32).dequantize() - w).pow(2).mean().item() for b in (2, 3, 4, 8)]
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < errors[0] / 1000


def test_all_zero_and_constant_groups_are_exact() -> None:
    w = torch.zeros(4, 64)
    w[1] = 0.5
    w[2, :32] = -3.0
    for symmetric in (False, True):
        q = quantize_tensor(w, 4, 32, symmetric)
        assert torch.isfinite(q.scales).all()
        assert torch.equal(q.dequantize(), w)
    assert torch.equal(quantize_tensor(w, 4, 32).dequantize()[0], torch.zeros(64))


def test_outlier_keeps_scales_finite() -> None:
    w = _weight()
    w[0, 0] = 1e4
    q = quantize_tensor(w, 4, 128)
    assert torch.isfinite(q.scales).all() and torch.isfinite(q.dequantize()).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_is_refused(bad: float) -> None:
    w = _weight()
    w[3, 5] = bad
    with pytest.raises(UnsupportedError, match="NaN or Inf"):
        quantize_tensor(w, 4, 128)


@pytest.mark.parametrize("bits,symmetric", [(4, False), (3, True)])
def test_a_group_size_that_does_not_divide_leaves_a_shorter_last_group(bits: int, symmetric: bool) -> None:
    w = _weight(8, 576)  # SmolLM2's width: 4 groups of 128 and one of 64
    q = quantize_tensor(w, bits, 128, symmetric)
    assert q.n_groups == 5 and q.scales.shape == (8, 5)
    assert q.nbytes == QuantizedTensor.analytic_nbytes((8, 576), bits, 128, symmetric, 2)
    padded = torch.nn.functional.pad(w, (0, 64))
    step = q.scales.float().repeat_interleave(128, dim=1)[:, :576]
    assert ((q.dequantize() - w).abs() <= step / 2 * (1 + 1e-5)).all()
    assert torch.equal(q.scales, quantize_tensor(padded, bits, 128, symmetric).scales)


def test_scale_overflow_in_fp16_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="overflow"):
        quantize_tensor(torch.full((2, 32), 1e9), 4, 32)
    assert torch.isfinite(quantize_tensor(torch.full((2, 32), 1e9), 4, 32, scale_dtype=torch.float32).dequantize()).all()


@pytest.mark.parametrize("bits,group_size,min_snr_db", [(8, None, 40.0), (4, 128, 19.0), (4, 32, 21.0), (3, 128, 12.5)])
def test_signal_to_noise_floor_on_gaussian_weights(bits: int, group_size: int | None, min_snr_db: float) -> None:
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(1))
    err = quantize_tensor(w, bits, group_size).dequantize() - w
    assert 10 * torch.log10(w.pow(2).mean() / err.pow(2).mean()) > min_snr_db


@pytest.mark.parametrize("symmetric", [False, True])
def test_per_tensor_uses_one_scale(symmetric: bool) -> None:
    w = _weight()
    q = quantize_tensor(w, 8, symmetric=symmetric, per_tensor=True)
    assert q.per_tensor and q.scales.numel() == 1
    assert q.nbytes == QuantizedTensor.analytic_nbytes((64, 256), 8, None, symmetric, 2, per_tensor=True)
    assert ((q.dequantize() - w).abs() <= q.scales.float() / 2 * (1 + 1e-5)).all()
    with pytest.raises(UnsupportedError, match="exclude"):
        quantize_tensor(w, 8, 32, per_tensor=True)


def test_mse_clip_search_never_increases_the_group_error_and_helps_outliers() -> None:
    from quantlab.quant.tensors.primitives import ClipSearch

    w = _weight()
    w[:, 7] *= 30  # one outlier column: every row's range is stretched by it
    plain = quantize_tensor(w, 3, 64)
    clipped = quantize_tensor(w, 3, 64, clip=ClipSearch())

    def err(q: QuantizedTensor) -> torch.Tensor:
        return (q.dequantize() - w).abs().pow(2.4).reshape(64, 4, 64).sum(-1)

    assert (err(clipped) <= err(plain) * (1 + 1e-6)).all()
    assert err(clipped).sum() < 0.95 * err(plain).sum()


@pytest.mark.parametrize("kind", ["grouped", "short-last-group", "per-channel", "per-tensor", "act-order"])
def test_a_range_of_rows_dequantizes_to_the_same_rows_of_the_whole(kind: str) -> None:
    w = torch.randn(37, 200, generator=torch.Generator().manual_seed(3))
    if kind == "act-order":
        from quantlab import gptq_quantize

        x = torch.randn(300, 200, generator=torch.Generator().manual_seed(4))
        q = gptq_quantize(w, 2 * x.T @ x / 300, 4, 40, act_order=True)
    else:
        group = {"grouped": 40, "short-last-group": 64}.get(kind)
        q = quantize_tensor(w, 3, group, per_tensor=kind == "per-tensor")
    whole = q.dequantize(torch.bfloat16)
    for rows in (slice(0, 5), slice(5, 36), slice(36, 37), slice(30, None)):
        assert torch.equal(q.dequantize(torch.bfloat16, rows), whole[rows])


@pytest.mark.slow
def test_quantizing_inside_a_compiled_graph_gives_the_same_bits() -> None:
    # A static KV cache quantizes each new position inside the compiled step: scales rounded up to float16 and
    # codes must be those of the eager function (inductor keeps float16 intermediates in float32 otherwise).
    torch.manual_seed(0)
    x = torch.randn(512, 64) * torch.logspace(-3, 2, 512).unsqueeze(-1)
    for bits, group in ((4, 16), (8, None), (3, 32)):
        want = quantize_tensor(x, bits, group)
        got = torch.compile(lambda t: quantize_tensor(t, bits, group), fullgraph=True)(x)
        for name in ("packed", "scales", "zeros"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (bits, group, name)
