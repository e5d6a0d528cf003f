import json
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import rel_error
from quantlab import gptq_quantize, quantize_tensor
from quantlab.quant.forms.affine import int4pack
from quantlab.quant.forms.affine.torch_int import Int4CPUKernel

CPU = torch.device("cpu")
# (out, in, group): whole blocks of 64 and of 32 rows, a last block of 16 or 48 rows, groups 32 to 256
SHAPES = [(80, 64, 32), (48, 128, 64), (256, 640, 32), (16, 256, 128), (208, 256, 256), (96, 576, 64)]

pytestmark = pytest.mark.skipif(int4pack.torch_layout() is None or not hasattr(torch, "_weight_int4pack_mm_for_cpu"),
                                reason="torch's int4 CPU packing is read back on x86 only")

# Run under each CPU capability torch dispatches to (ATEN_CPU_CAPABILITY), since each packs its own way: every
# shape's weights read back from the packed bytes, rounded to bfloat16, equal torch's own kernel multiplying them by
# the identity (its bfloat16 output), bit for bit; and a window of the packed rows equals those rows of the whole.
CHECK = """
import json, torch
from quantlab.quant.forms.affine import int4pack
found = {"layout": int4pack.torch_layout(), "exact": [], "window": []}
for n, k, g in %r:
    gen = torch.Generator().manual_seed(n + k + g)
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = torch.randn(k // g, n, 2, generator=gen).to(torch.bfloat16)
    layout = int4pack.checked_layout(codes, packed, sz, g)
    w = int4pack.dequantize_t(packed, sz, g, layout, 0, n, torch.float32).t()
    kernel = torch._weight_int4pack_mm_for_cpu(torch.eye(k, dtype=torch.bfloat16), packed, g, sz).t()
    found["exact"].append(layout == found["layout"] and torch.equal(w.to(torch.bfloat16), kernel))
    window = int4pack.dequantize_t(packed, sz, g, layout, 16, n - 16, torch.bfloat16).t()
    found["window"].append(torch.equal(window, w[16:n - 16].to(torch.bfloat16)))
print(json.dumps(found))
""" % (SHAPES,)


@pytest.mark.parametrize("capability", [None, "avx2", "default"])
def test_each_layout_reads_back_torchs_own_weights_bit_for_bit(capability) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["layout"] == {None: int4pack.torch_layout(), "avx2": 32, "default": 0}[capability]
    assert found["exact"] == [True] * len(SHAPES)
    assert found["window"] == [True] * len(SHAPES)


def test_a_layout_that_does_not_read_back_leaves_the_weight_on_torchs_kernel() -> None:
    codes = torch.randint(0, 16, (64, 128), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = torch.rand(4, 64, 2).to(torch.bfloat16) + 0.5
    assert int4pack.checked_layout(codes, packed, sz, 32) == int4pack.torch_layout()
    assert int4pack.checked_layout((codes + 1) % 16, packed, sz, 32) is None
    swapped = packed.view(64, -1).flip(0).contiguous()  # rows of another weight's layout
    assert int4pack.checked_layout(codes, swapped, sz, 32) is None


def _kernel(out: int, n_in: int, group: int | None) -> tuple[Int4CPUKernel, torch.Tensor]:
    w = torch.randn(out, n_in, generator=torch.Generator().manual_seed(out + n_in)) * 0.05
    q = quantize_tensor(w, 4, group, False)
    return Int4CPUKernel(q, torch.bfloat16), q.dequantize()


@pytest.mark.parametrize("shape,group", [((208, 512), 32), ((96, 576), 128), ((1536, 576), 64), ((64, 512), None)])
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 13, 128])
def test_long_inputs_multiply_the_kernels_own_weights_in_bf16(shape, group, rows) -> None:
    """1-8 rows through torch's kernel, more through the weights read back as bfloat16 and the dense matmul; both
    agree with the dequantized reference, and the long path equals the dense product of the kernel's own weights
    (a short last group of 576 = 4 x 128 + 64 and one scale per row included)."""
    kernel, dequantized = _kernel(*shape, group)
    assert kernel.layout == int4pack.torch_layout()
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    y = kernel(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, shape[0])
    assert rel_error(y, x.float() @ dequantized.T) < 1e-2
    if rows > kernel.max_fused_rows:
        own = kernel.rows_t(0, shape[0], torch.float32).t()  # the kernel's float32 weights
        assert rel_error(own, dequantized) < 1e-2
        assert rel_error(y, x @ own.to(torch.bfloat16).T) < 4e-3  # the dense bf16 product, up to its block order


def test_long_inputs_keep_act_order_columns_and_batch_shape() -> None:
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(2)) * 0.05
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(3))
    q = gptq_quantize(w, 2 * x.T @ x / 256, 4, 32, act_order=True)
    kernel = Int4CPUKernel(q, torch.bfloat16)
    assert kernel.column_order is not None and kernel.layout == int4pack.torch_layout()
    xb = x[:64].to(torch.bfloat16).reshape(2, 32, 256)
    y = kernel(xb)
    assert y.shape == (2, 32, 128)
    assert rel_error(y, xb.float() @ q.dequantize().T) < 1e-2
    assert rel_error(y[0, :8], kernel(xb[0, :8])) < 4e-3  # eight rows through torch's kernel: the same weights


def test_the_op_has_a_fake_of_its_output() -> None:
    codes = torch.randint(0, 16, (80, 64), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = torch.ones(2, 80, 2, dtype=torch.bfloat16)
    real = int4pack.dequantize_t_op(packed, sz, 32, int4pack.torch_layout(), 16, 80, torch.bfloat16)
    with FakeTensorMode() as mode:
        fake = int4pack.dequantize_t_op(mode.from_tensor(packed), mode.from_tensor(sz), 32, int4pack.torch_layout(),
                                        16, 80, torch.bfloat16)
    assert fake.shape == real.shape == (64, 64) and fake.dtype == real.dtype
