import pytest
import torch

from conftest import rel_error
from quantlab import gptq_quantize, quantize_tensor
from quantlab.quant.forms.affine.bitplane import BitplaneCPUKernel
from quantlab.quant.forms.affine.torch_int import (
    Int4CPUKernel,
    Int4TinyGemmKernel,
    Int8CastKernel,
    Int8Kernel,
    tinygemm_inner_k_tiles,
)
from quantlab.quant.kernels.base import KERNELS, DequantKernel, choose_kernel

CPU = torch.device("cpu")
# What torch's kernels do not take goes to the bit-plane kernel on CPU when its inputs and groups are whole 32-code
# blocks, else dequantizes. GPTQModel's CPU kernels are slower and recompile under torch.compile, so `auto` leaves
# them to recipes that name them.


def _weight(out: int = 96, n_in: int = 512) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05


def _x(n_in: int = 512, rows: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("bits,group_size,symmetric,expected", [
    (4, 128, False, Int4CPUKernel), (4, 32, True, Int4CPUKernel), (4, None, False, Int4CPUKernel),
    (8, None, False, Int8Kernel), (8, None, True, Int8Kernel), (8, 128, False, BitplaneCPUKernel),
    (3, 128, False, BitplaneCPUKernel), (4, 16, False, DequantKernel),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_choice_and_agreement_with_the_dequantized_reference(bits, group_size, symmetric, expected, dtype) -> None:
    q = quantize_tensor(_weight(), bits, group_size, symmetric)
    kernel = choose_kernel(q, CPU, dtype)
    # torch's CPU int kernels are fast for bfloat16 activations only, so float32 ones go to the bit-plane kernel.
    bitplane_or_dequant = DequantKernel if group_size == 16 else BitplaneCPUKernel
    assert type(kernel) is (expected if dtype == torch.bfloat16 else bitplane_or_dequant)
    x = _x(dtype=dtype)
    reference = x.float() @ q.dequantize().T
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_error(kernel(x), reference) < tol
    assert kernel(x).dtype == dtype
    assert rel_error(kernel.dequantize(), q.dequantize()) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("cls", [Int4CPUKernel, Int8Kernel, Int8CastKernel, BitplaneCPUKernel, DequantKernel])
def test_kernel_bytes_match_their_formula(cls) -> None:
    int8 = issubclass(cls, Int8Kernel)
    q = quantize_tensor(_weight(), 8 if int8 else 4, None if int8 else 64)
    kernel = cls(q) if cls is DequantKernel else cls(q, torch.bfloat16)
    held = sum(t.numel() * t.element_size() for t in kernel.buffers())
    assert held == kernel.analytic_nbytes()
    assert held < 96 * 512 * 2 * (0.3 if cls is Int4CPUKernel else 0.55)


def test_act_order_tensor_runs_on_the_int4_kernel_with_a_column_order() -> None:
    w, x = _weight(), _x(rows=256)
    q = gptq_quantize(w, 2 * x.T @ x / 256, 4, 64, act_order=True)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert isinstance(kernel, Int4CPUKernel) and kernel.column_order is not None
    assert rel_error(kernel(x.bfloat16()), x @ q.dequantize().T) < 2e-2
    assert rel_error(kernel.dequantize(), q.dequantize()) < 1e-2


def test_a_kernel_can_be_forced_and_batched_inputs_keep_their_shape() -> None:
    q = quantize_tensor(_weight(), 4, 128)
    kernel = choose_kernel(q, CPU, torch.float32, ["dequantize+matmul"])
    assert isinstance(kernel, DequantKernel)
    assert kernel(torch.randn(2, 3, 512)).shape == (2, 3, 96)
    assert choose_kernel(q, CPU, torch.bfloat16)(torch.randn(2, 3, 512).bfloat16()).shape == (2, 3, 96)


@pytest.mark.parametrize("symmetric", [False, True])
def test_int8_cast_form_agrees_with_the_reference(symmetric: bool) -> None:
    # The CUDA int8 path's arithmetic, run on CPU: codes cast to bf16, matmul, row scales (+ zero-point offset).
    q = quantize_tensor(_weight(), 8, None, symmetric)
    kernel = Int8CastKernel(q, torch.bfloat16)
    x = _x(dtype=torch.bfloat16)
    assert rel_error(kernel(x), x.float() @ q.dequantize().T) < 2e-2
    assert rel_error(kernel(x), Int8Kernel(q, torch.bfloat16)(x)) < 1e-2
    assert (kernel.offset is None) == symmetric


def _first_path(q, device: torch.device, dtype: torch.dtype) -> str:
    return next(path for path, cls in KERNELS.items() if cls.supports(q, device, dtype) and not cls.rounded_inputs)


def test_int8_on_cuda_prefers_the_cast_form_for_bf16_and_cpu_keeps_torchs_kernel() -> None:
    q = quantize_tensor(_weight(), 8, None)
    cuda = torch.device("cuda")  # supports() only reads the device type; nothing runs on it
    assert _first_path(q, cuda, torch.bfloat16) == "int8_cast_mm"
    assert _first_path(q, cuda, torch.float16) == "int8pack_mm"  # an fp16 sum of raw codes could overflow
    assert _first_path(q, CPU, torch.bfloat16) == "int8pack_mm"


@pytest.mark.parametrize("shape,group", [((96, 576), 128), ((1536, 576), 128), ((64, 96), 64), ((96, 544), 256)])
@pytest.mark.parametrize("symmetric", [False, True])
def test_a_short_last_group_runs_on_the_int4_kernel_as_a_second_matmul(shape, group, symmetric: bool) -> None:
    """SmolLM2's 576-wide inputs with groups of 128 end in a group of 64: no padding, no extra bytes, no slow path."""
    q = quantize_tensor(_weight(*shape), 4, group, symmetric)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert isinstance(kernel, Int4CPUKernel) and kernel.tail == shape[1] % group
    held = sum(t.numel() * t.element_size() for t in kernel.buffers())
    assert held == kernel.analytic_nbytes()
    assert held == shape[0] * shape[1] // 2 + shape[0] * -(-shape[1] // group) * 2 * 2  # codes + (scale, zero) per group
    x = _x(shape[1], rows=3, dtype=torch.bfloat16)
    assert rel_error(kernel(x), x.float() @ q.dequantize().T) < 2e-2
    assert rel_error(kernel.dequantize(), q.dequantize()) < 1e-2


def test_a_tail_that_is_no_kernel_group_or_act_order_columns_are_not_split() -> None:
    odd = quantize_tensor(_weight(96, 560), 4, 128)  # ends in a group of 48
    assert isinstance(choose_kernel(odd, CPU, torch.bfloat16), DequantKernel)


@pytest.mark.parametrize("shape,tiles", [((256, 1024), 8), ((256, 640), 8), ((256, 64), 4), ((256, 96), 2),
                                         ((100, 1024), None), ((256, 48), None)])
def test_tinygemm_takes_shapes_its_packing_accepts(shape, tiles) -> None:
    assert tinygemm_inner_k_tiles(*shape) == tiles
    q = quantize_tensor(_weight(*shape), 4, 32 if shape[1] % 64 else 64)
    path = _first_path(q, torch.device("cuda"), torch.bfloat16)
    assert (path == "int4_tinygemm_cuda") == (tiles is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,group", [((256, 1024), 128), ((256, 640), 128), ((64, 96), 32), ((256, 576), 128)])
def test_tinygemm_on_cuda_agrees_with_the_reference(shape, group) -> None:
    dev = torch.device("cuda")
    q = quantize_tensor(_weight(*shape).to(dev), 4, group)
    kernel = choose_kernel(q, dev, torch.bfloat16)
    assert isinstance(kernel, Int4TinyGemmKernel)
    x = _x(shape[1], dtype=torch.bfloat16).to(dev)
    assert rel_error(kernel(x), x.float() @ q.dequantize().T) < 2e-2
    assert rel_error(kernel.dequantize(), q.dequantize()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("symmetric", [False, True])
def test_int8_cast_on_cuda_agrees_with_the_reference_eager_and_compiled(symmetric: bool) -> None:
    dev = torch.device("cuda")
    q = quantize_tensor(_weight(256, 1024).to(dev), 8, None, symmetric)
    kernel = choose_kernel(q, dev, torch.bfloat16)
    assert isinstance(kernel, Int8CastKernel)
    x = _x(1024, dtype=torch.bfloat16).to(dev)
    reference = x.float() @ q.dequantize().T
    assert rel_error(kernel(x), reference) < 2e-2
    assert rel_error(torch.compile(kernel)(x), reference) < 2e-2


@pytest.mark.parametrize("bits,group_size", [(4, 128), (3, 64), (2, None)])
def test_dequantize_kernel_in_row_blocks_on_cpu_matches_the_whole_weight(bits, group_size) -> None:
    q = quantize_tensor(_weight(), bits, group_size)
    kernel = DequantKernel(q)
    kernel.cpu_block_elements = 7 * 512  # blocks of 7 rows: 96 rows end in a shorter block
    x = _x(rows=6).reshape(2, 3, 512)
    y = kernel(x)
    assert y.shape == (2, 3, 96)
    assert rel_error(y, x @ q.dequantize().T) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("symmetric", [True, False])
def test_compiled_one_row_int8_on_cpu_fuses_the_codes_and_agrees_with_torchs_kernel(symmetric: bool) -> None:
    from quantlab.engine.torch.compiled import fused_row_linears

    q = quantize_tensor(_weight(), 8, None, symmetric)
    kernel = Int8Kernel(q, torch.bfloat16)
    x = _x(rows=1, dtype=torch.bfloat16)
    compiled = torch.compile(kernel, dynamic=False)
    reference = x.float() @ q.dequantize().T
    # float32 accumulation of exact code x activation products: the bf16 output's rounding and no more.
    assert rel_error(compiled(x), reference) < 4e-3
    assert rel_error(compiled(x), kernel(x)) < 8e-3
    # A plain bf16 linear under the engine's fused one-row path: the same float32 accumulation, bias included.
    linear = torch.nn.Linear(512, 96).to(torch.bfloat16)
    with fused_row_linears(linear) as changed:
        got = torch.compile(linear, dynamic=False)(x)
        assert changed == 1
    want = x.float() @ linear.weight.float().T + linear.bias.float()
    assert rel_error(got, want) < 4e-3 and "forward" not in vars(linear)


@pytest.mark.parametrize("group_size", [32, 128, None])
def test_float_zero_points_run_on_the_int4_kernel_exactly(group_size) -> None:
    # Q4_1 and HQQ keep an unrounded zero point per group; the int4 kernels' (code - 8)·scale + zero form holds it.
    from quantlab.quant.forms.affine.float_zero import quantize_float_zero

    q = quantize_float_zero(_weight(), 4, group_size)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert type(kernel) is Int4CPUKernel
    x = _x(dtype=torch.bfloat16)
    assert rel_error(kernel(x), x.float() @ q.dequantize().T) < 1e-2
    assert rel_error(kernel.dequantize(), q.dequantize()) < 4e-3  # the bf16 rounding of scale and zero
    if group_size is not None:
        assert kernel.analytic_nbytes() == q.layout_nbytes()


@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_prompts_multiply_the_exact_codes_in_bf16_and_short_inputs_keep_torchs_kernel(symmetric: bool) -> None:
    """More than 32 rows: the int8 codes widened to bf16 (exactly: every int8 is a bf16) and the dense matmul, the
    scales after; up to 32 rows torch's kernel, whose result the long path agrees with to bf16 rounding."""
    q = quantize_tensor(_weight(200, 512), 8, None, symmetric)
    kernel = choose_kernel(q, CPU, torch.bfloat16)
    assert type(kernel) is Int8Kernel
    assert torch.equal(kernel.codes.to(torch.bfloat16).to(torch.int8), kernel.codes)
    x = _x(rows=128, dtype=torch.bfloat16)
    long, reference = kernel(x), x.float() @ q.dequantize().T
    assert rel_error(long, reference) < 1e-2
    rows = kernel.max_fused_rows
    short = torch.cat([kernel(x[i:i + rows]) for i in range(0, 128, rows)])  # torch's kernel, 32 rows a call
    assert rel_error(long, short) < 8e-3
    scaled = (x @ kernel.codes.to(torch.bfloat16).T).float() * kernel.scales.float()
    if kernel.offset is not None:
        scaled = scaled + x.sum(-1, keepdim=True).float() * kernel.offset.float()
    assert rel_error(long, scaled) < 4e-3
