import pytest
import torch

from conftest import rel_error
from quantlab import gptq_quantize, native, quantize_tensor
from quantlab.errors import UnsupportedError
from quantlab.quant.forms.affine import bitplane as kernel_bitplane
from quantlab.quant.forms.affine.bitplane import BitplaneCPUKernel, from_bitplanes, to_bitplanes
from quantlab.quant.kernels.base import DequantKernel, choose_kernel
from quantlab.quant.tensors.primitives import packed_row_bytes

CPU = torch.device("cpu")


def _weight(out: int = 96, n_in: int = 576) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _x(n_in: int = 576, rows: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("bits", range(1, 9))
def test_bit_planes_round_trip_exactly_in_the_bytes_of_the_packed_format(bits: int) -> None:
    codes = torch.randint(0, 1 << bits, (7, 192), generator=torch.Generator().manual_seed(bits), dtype=torch.uint8)
    planes = to_bitplanes(codes, bits)
    assert planes.dtype == torch.uint8 and planes.shape == (7, packed_row_bytes(192, bits))
    assert torch.equal(from_bitplanes(planes, bits, 192), codes)


def test_the_layout_is_the_documented_one() -> None:
    # 3 bits: a two-bit plane (code 8i+t at bits 2i of byte t), then a one-bit plane (top bit of 8i+t: bit t of byte i).
    codes = torch.zeros(1, 32, dtype=torch.uint8)
    codes[0, 8 * 1 + 5] = 3   # low bits 0b11 at bits 2, 3 of byte 5
    codes[0, 8 * 2 + 6] = 4   # top bit only: bit 6 of byte 8 + 2
    codes[0, 8 * 3 + 0] = 7   # 0b11 at bits 6, 7 of byte 0, and bit 0 of byte 8 + 3
    expected = [0] * 12
    expected[5], expected[10], expected[0], expected[11] = 0b1100, 1 << 6, 0b11000000, 1
    assert to_bitplanes(codes, 3)[0].tolist() == expected


@pytest.mark.parametrize("bits,group_size,symmetric", [
    (3, 128, False), (2, 64, False), (3, 32, True), (5, None, False), (8, 128, False), (4, 128, False), (1, 64, False),
])
@pytest.mark.parametrize("rows", [1, 3, 6, 13])  # 6 crosses the kernel's 4-row chunks; 13 takes the dense path
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_agrees_with_the_dequantized_reference(bits, group_size, symmetric, rows, dtype) -> None:
    q = quantize_tensor(_weight(), bits, group_size, symmetric)  # 576 inputs: groups of 128 end in one of 64
    kernel = BitplaneCPUKernel(q, dtype)
    x = _x(rows=rows, dtype=dtype)
    y = kernel(x)
    assert y.dtype == dtype and y.shape == (rows, 96)
    assert rel_error(y, x.float() @ q.dequantize().T) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert rel_error(kernel.dequantize(), q.dequantize()) < 1e-6


@pytest.mark.parametrize("bits,group_size,symmetric", [
    (3, 128, False), (2, 64, False), (3, 32, True), (5, None, False), (4, 128, False), (1, 64, False), (7, 64, False),
])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 13])
def test_bfloat16_activations_agree_within_float32_rounding(bits, group_size, symmetric, rows) -> None:
    # a bf16 model's activations are all bfloat16: the kernel multiplies them with the codes in bfloat16 dot
    # products where the CPU has them (exact products, float32 sums), and the result is float32's; 97 outputs: the
    # kernel takes weight rows two at a time, so the last one comes alone
    q = quantize_tensor(_weight(out=97), bits, group_size, symmetric)
    x = _x(rows=rows).bfloat16().float()
    y = BitplaneCPUKernel(q, torch.bfloat16).fused(x).double()
    assert rel_error(y, x.double() @ q.dequantize().double().T) < 1e-5


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_every_scale_dtype_is_read_as_stored(scale_dtype: torch.dtype) -> None:
    q = quantize_tensor(_weight(), 3, 64, scale_dtype=scale_dtype)
    kernel = BitplaneCPUKernel(q, torch.float32)
    assert kernel.scales.dtype == scale_dtype
    assert torch.allclose(kernel.dequantize(), q.dequantize(), rtol=1e-6, atol=1e-7)
    assert rel_error(kernel(_x()), _x() @ q.dequantize().T) < 1e-5


def test_auto_takes_it_for_widths_and_dtypes_torch_has_no_cpu_kernel_for() -> None:
    for bits, group, dtype in [(3, 128, torch.bfloat16), (2, 64, torch.bfloat16), (4, 128, torch.float32),
                               (8, 128, torch.bfloat16)]:
        assert isinstance(choose_kernel(quantize_tensor(_weight(), bits, group), CPU, dtype), BitplaneCPUKernel)
    # Inputs or groups that are not whole 32-code blocks dequantize instead.
    assert isinstance(choose_kernel(quantize_tensor(_weight(96, 560), 3, 112), CPU, torch.bfloat16), DequantKernel)
    assert isinstance(choose_kernel(quantize_tensor(_weight(), 3, 16), CPU, torch.bfloat16), DequantKernel)
    assert isinstance(choose_kernel(quantize_tensor(_weight(), 3, 64), CPU, torch.float16), DequantKernel)
    assert isinstance(choose_kernel(quantize_tensor(_weight(), 3, per_tensor=True), CPU, torch.bfloat16), DequantKernel)


@pytest.mark.parametrize("bits,group_size,symmetric", [(3, 128, False), (2, 64, True), (5, None, False)])
def test_bytes_held_are_the_packed_formats(bits: int, group_size: int | None, symmetric: bool) -> None:
    q = quantize_tensor(_weight(1536, 576), bits, group_size, symmetric)
    kernel = BitplaneCPUKernel(q, torch.bfloat16)
    held = sum(t.numel() * t.element_size() for t in kernel.buffers())
    assert held == kernel.analytic_nbytes() == q.nbytes  # codes in planes, scales and packed zeros as they were
    if (bits, group_size) == (3, 128):
        assert held == 1536 * 576 * 3 // 8 + 1536 * 5 * 2 + 1536 * packed_row_bytes(5, 3)
        assert 8 * held / (1536 * 576) < 3.2  # bits per weight, against bf16's 16


def test_act_order_columns_are_gathered_into_contiguous_groups() -> None:
    w, x = _weight(), _x(rows=256)
    q = gptq_quantize(w, 2 * x.T @ x / 256, 3, 64, act_order=True)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert isinstance(kernel, BitplaneCPUKernel) and kernel.column_order is not None
    assert rel_error(kernel(x[:2].bfloat16()), x[:2] @ q.dequantize().T) < 1e-2
    assert rel_error(kernel.dequantize(), q.dequantize()) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: its rows split between threads in pairs
def test_the_result_does_not_depend_on_the_thread_count(dtype: torch.dtype) -> None:
    kernel = BitplaneCPUKernel(quantize_tensor(_weight(out=97), 3, 128), dtype)
    x = _x(rows=2, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, kernel(x))  # each output row is summed by one thread, in one order


def test_batched_inputs_keep_their_shape_and_torch_compile_captures_the_ops() -> None:
    kernel = BitplaneCPUKernel(quantize_tensor(_weight(), 2, 64), torch.float32)
    x = torch.randn(2, 3, 576)
    assert kernel(x).shape == (2, 3, 96)
    compiled = torch.compile(kernel, backend="aot_eager", fullgraph=True)
    for rows in (1, 16):  # the fused op and the dense path, each without a graph break
        x = _x(rows=rows)
        assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-6)


def test_without_a_compiler_the_choice_passes_on(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("QUANTLAB_KERNEL_CACHE", str(tmp_path / "cache"))
    native.load.cache_clear()
    try:
        with pytest.raises(UnsupportedError, match="no C compiler was found"):
            native.load("bitplane")
    finally:
        native.load.cache_clear()

    def no_library():
        raise UnsupportedError("building the bitplane kernel failed")

    monkeypatch.setattr(kernel_bitplane, "library", no_library)
    assert isinstance(choose_kernel(quantize_tensor(_weight(), 3, 128), CPU, torch.bfloat16), DequantKernel)
    with pytest.raises(UnsupportedError, match="bitplane kernel failed"):
        choose_kernel(quantize_tensor(_weight(), 3, 128), CPU, torch.bfloat16, ["bitplane_cpu"])


def test_a_build_is_cached_per_source_compiler_and_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("QUANTLAB_KERNEL_CACHE", str(tmp_path))
    native.load.cache_clear()
    try:
        native.load("bitplane")
        built = list(tmp_path.glob("bitplane-*.so"))
        assert len(built) == 1 and not [p for p in tmp_path.iterdir() if p.is_dir()]  # no build folder left
        native.load.cache_clear()
        stamp = built[0].stat().st_mtime_ns
        native.load("bitplane")
        assert built[0].stat().st_mtime_ns == stamp  # found, not rebuilt
    finally:
        native.load.cache_clear()


@pytest.mark.parametrize("bits", [2, 3, 5, 8])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_float_zero_points_hqqs_form_are_read_as_stored(bits: int, scale_dtype: torch.dtype) -> None:
    from quantlab.quant.forms.affine.float_zero import quantize_float_zero

    q = quantize_float_zero(_weight(), bits, 64, optimize=True, scale_dtype=scale_dtype)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert isinstance(kernel, BitplaneCPUKernel) and kernel.zeros.dtype == scale_dtype
    held = sum(t.numel() * t.element_size() for t in kernel.buffers())
    assert held == kernel.analytic_nbytes() == q.layout_nbytes()
    ref = q.dequantize()
    assert rel_error(kernel.dequantize(), ref) < 1e-6
    for rows in (1, 5, 13):
        x = _x(rows=rows)
        assert rel_error(kernel(x), x @ ref.T) < 1e-5
