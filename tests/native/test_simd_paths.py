"""Kernels with an AVX-512 path and an AVX2 one: both builds agree with the dequantized reference and with each
other, on shapes off the SIMD width, for 1-13 rows (the machine's own build takes the AVX-512 path where the CPU
has it; the other is built with ``-mno-avx512f``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_error
from quantlab.errors import UnsupportedError
from quantlab.kv import code_attention
from quantlab.kv.packed import Codec
from quantlab.kv.static import CodeStore
from quantlab.quant.forms.affine import bitplane as bitplane_kernels
from quantlab.quant.forms.affine.tensor import quantize_tensor
from quantlab.quant.forms.codebook import kernel as lut4_kernels
from quantlab.quant.forms.codebook.kernel import Lut4CPUKernel
from quantlab.quant.forms.codebook.tensor import quantize_codebook
from quantlab.quant.forms.float8 import kernel as fp8_kernels
from quantlab.quant.forms.microscaling.kernel import E2M1CPUKernel, MXFP8CPUKernel
from quantlab.quant.forms.microscaling.quantize import quantize_mx, quantize_nvfp4
from quantlab.quant.kernels import base as kernels_base

NO_AVX512 = ("-mno-avx512f",)
ROWS = [1, 2, 3, 5, 13]


def _avx512() -> bool:
    from pathlib import Path
    try:
        return " avx512bw" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _builds(module, monkeypatch: pytest.MonkeyPatch):
    """Each build of ``module``'s library in turn: the machine's, then without AVX-512."""
    default = module.library
    try:
        default(NO_AVX512)
    except UnsupportedError as e:
        pytest.skip(f"no C compiler for the second build: {e}")
    yield "native"
    monkeypatch.setattr(module, "library", lambda flags=(): default(flags or NO_AVX512))
    monkeypatch.setattr(kernels_base, "has_cpp_kernel", lambda op: False)  # the ops' C++ kernels link the native build
    yield "no-avx512"


def _products(kernel_for, module, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    out = {}
    for build in _builds(module, monkeypatch):
        out[build] = kernel_for()(x)
    return out


def _weight(out: int, n_in: int) -> torch.Tensor:
    w = torch.randn(out, n_in, generator=torch.Generator().manual_seed(0)) * 0.05
    w[:, 3] *= 40  # an outlier column: scales differ across blocks
    return w


def _x(rows: int, n_in: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)


def _check(ys: dict[str, torch.Tensor], ref: torch.Tensor, dtype: torch.dtype, tol32: float = 1e-5) -> None:
    tol = tol32 if dtype == torch.float32 else 1e-2
    for build, y in ys.items():
        assert y.dtype == dtype and y.shape == ref.shape, build
        assert rel_error(y.float(), ref) < tol, build
    assert rel_error(ys["native"].float(), ys["no-avx512"].float()) < tol


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("codebook, block, double_quant, n_in", [("nf4", 64, True, 576), ("fp4", 32, False, 576),
                                                                ("nf4", 128, False, 640)])
def test_codebook_builds_agree(rows: int, dtype: torch.dtype, codebook: str, block: int, double_quant: bool, n_in: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    q = quantize_codebook(_weight(40, n_in), codebook, block, double_quant)
    x = _x(rows, n_in, dtype)
    ys = _products(lambda: Lut4CPUKernel(q, dtype), lut4_kernels, x, monkeypatch)
    _check(ys, F.linear(x.float(), q.dequantize()), dtype)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["mxfp4", "nvfp4"])
def test_e2m1_builds_agree(rows: int, dtype: torch.dtype, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _weight(24, 608)  # 19 blocks of 32, 38 of 16
    q = quantize_mx(w, "e2m1") if form == "mxfp4" else quantize_nvfp4(w)
    x = _x(rows, 608, dtype)
    ys = _products(lambda: E2M1CPUKernel(q, dtype), lut4_kernels, x, monkeypatch)
    _check(ys, F.linear(x.float(), q.dequantize()), dtype)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_in", [592, 640])  # 18.5 x 32: a tail of 16 after the 32-wide steps; whole 64s
def test_fp8_builds_agree(rows: int, dtype: torch.dtype, n_in: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantlab.quant.forms.float8.kernel import FP8CPUKernel
    from quantlab.quant.forms.float8.tensor import quantize_fp8

    for kind in ("e4m3", "e5m2"):
        q = quantize_fp8(_weight(24, n_in), kind)
        x = _x(rows, n_in, dtype)
        ys = _products(lambda: FP8CPUKernel(q, dtype), fp8_kernels, x, monkeypatch)
        _check(ys, F.linear(x.float(), q.dequantize()), dtype)
        monkeypatch.undo()


@pytest.mark.parametrize("rows", ROWS)
def test_mxfp8_builds_agree(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    q = quantize_mx(_weight(24, 608), "e4m3")
    x = _x(rows, 608, torch.float32)
    ys = _products(lambda: MXFP8CPUKernel(q, torch.float32), fp8_kernels, x, monkeypatch)
    _check(ys, F.linear(x, q.dequantize()), torch.float32)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits, group", [(2, 64), (3, 128), (4, 32), (3, None)])
def test_bitplane_builds_agree(rows: int, dtype: torch.dtype, bits: int, group: int | None,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    q = quantize_tensor(_weight(24, 640), bits, group)  # 640: groups of 128 end in a short one
    x = _x(rows, 640, dtype)
    ys = _products(lambda: bitplane_kernels.BitplaneCPUKernel(q, dtype), bitplane_kernels, x, monkeypatch)
    # the zero points' term (scale x zero x the group's sum of x) cancels most of the codes' sum: per channel, 640
    # codes with an outlier column in the scale, float32 keeps about 5 digits of the difference
    _check(ys, F.linear(x.float(), q.dequantize()), dtype, tol32=5e-5)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("form", ["f16 scales", "bf16 scales", "f32 scales", "symmetric", "f16 float zeros",
                                  "bf16 float zeros"])
def test_bitplane_builds_read_every_scale_and_zero_form(rows: int, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 32 over 640 columns (20 a row: the AVX2 path's eight-group pass twice, then a tail of four) in every
    stored form of scales and zero points."""
    from quantlab.quant.forms.affine.float_zero import quantize_float_zero

    w = _weight(24, 640)
    scale_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}.get(form.split()[0], torch.float16)
    q = (quantize_float_zero(w, 3, 32, scale_dtype=scale_dtype) if "float zeros" in form else
         quantize_tensor(w, 3, 32, symmetric=form == "symmetric", scale_dtype=scale_dtype))
    x = _x(rows, 640, torch.float32)
    ys = _products(lambda: bitplane_kernels.BitplaneCPUKernel(q, torch.float32), bitplane_kernels, x, monkeypatch)
    _check(ys, F.linear(x, q.dequantize()), torch.float32, tol32=5e-5)


KV_CODECS = [*[Codec(bits=b, group_size=g) for b in (8, 4, 2) for g in (16, 64)], Codec(bits=3, group_size=16),
             *[Codec(dtype=d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)],
             *[Codec(element=e) for e in code_attention.BLOCK_KINDS]]


@pytest.mark.parametrize("codec", KV_CODECS, ids=str)
@pytest.mark.parametrize("d, g", [(64, 3), (256, 4), (96, 1), (40, 5)])  # 96: 6 chunks of 16; 40: the AVX2 path
def test_kv_attention_builds_agree(codec: Codec, d: int, g: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores and weighted values over stored KV codes, 4 rows at a time in the AVX-512 build: every stored
    length (none, a partial group of 4 rows, whole ones) against the dequantized products, in both builds."""
    b, h, slots = 1, 2, 23
    if codec.element is not None and d % 32:
        pytest.skip("the block forms take whole blocks of 32 channels")
    torch.manual_seed(0)
    store = CodeStore(codec, b, h, slots, d, torch.device("cpu"))
    store.write(torch.arange(slots), torch.randn(b, h, slots, d) * 3)
    ref = store.read(torch.float32).reshape(b * h, slots, d)
    q, p = torch.randn(b * h, g, d), torch.softmax(torch.randn(b * h, g, slots), -1)
    args = code_attention._store_args(store)
    for valid in (slots, 13, 4, 1, 0):
        n = torch.tensor(valid)
        got = {build: (code_attention.kv_scores(*args, n, q), code_attention.kv_values(*args, n, p))
               for build in _builds(code_attention, monkeypatch)}
        monkeypatch.undo()
        for build, (scores, values) in got.items():
            assert torch.allclose(scores[..., :valid], q @ ref[:, :valid].transpose(1, 2), atol=1e-4, rtol=1e-5), build
            assert torch.equal(scores[..., valid:], torch.zeros_like(scores[..., valid:])), build
            assert torch.allclose(values, p[..., :valid] @ ref[:, :valid], atol=1e-5, rtol=1e-5), build


@pytest.mark.parametrize("codec", [Codec(bits=b, axis="channel", group_size=g) for b, g in
                                   ((2, 32), (4, 16), (8, 64), (2, 48), (3, 32), (2, 8))], ids=str)
@pytest.mark.parametrize("d, g", [(64, 3), (256, 4), (40, 5)])
def test_kv_channel_keys_builds_agree(codec: Codec, d: int, g: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores over keys stored per channel (KIVI: a scale and zero point per channel over a block of positions),
    the AVX-512 build keeping a block's accumulators in registers, against the dequantized products."""
    b, h, slots = 1, 2, 3 * codec.group_size
    torch.manual_seed(0)
    store = CodeStore(codec, b, h, slots, d, torch.device("cpu"))
    store.write(torch.arange(slots), torch.randn(b, h, slots, d) * 3)
    ref = store.read(torch.float32).reshape(b * h, slots, d)
    q = torch.randn(b * h, g, d)
    args = code_attention._store_args(store)
    for valid in (slots, codec.group_size, 0):  # whole blocks
        n = torch.tensor(valid)
        got = {build: code_attention.kv_scores(*args, n, q) for build in _builds(code_attention, monkeypatch)}
        monkeypatch.undo()
        # a block's scores are the codes' sum less the zero points' share: float32 keeps about 6 digits of the
        # terms' magnitude (|q| . |k|), not of their difference
        atol = 1e-6 * float((q.abs() @ ref.abs().transpose(1, 2)).max())
        for build, scores in got.items():
            assert torch.allclose(scores[..., :valid], q @ ref[:, :valid].transpose(1, 2), atol=atol, rtol=1e-5), build
            assert torch.equal(scores[..., valid:], torch.zeros_like(scores[..., valid:])), build


def _with_build(module, flags: tuple[str, ...], make):
    default, cpp = module.library, kernels_base.has_cpp_kernel
    try:
        module.library = lambda f=(): default(f or flags)
        kernels_base.has_cpp_kernel = lambda op: False  # the ops' C++ kernels link the native build
        return make()
    finally:
        module.library, kernels_base.has_cpp_kernel = default, cpp


def test_this_machine_takes_the_avx512_path_where_it_has_one() -> None:
    """The machine's build differs from the AVX2 one exactly where the CPU has AVX-512 (the two sum in other
    orders, so their float32 outputs differ in the last bits)."""
    from quantlab.quant.forms.float8.kernel import FP8CPUKernel
    from quantlab.quant.forms.float8.tensor import quantize_fp8

    x = _x(1, 2048, torch.float32)
    for module, q, cls in ((lut4_kernels, quantize_codebook(_weight(256, 2048), "nf4", 64, False), Lut4CPUKernel),
                           (fp8_kernels, quantize_fp8(_weight(256, 2048), "e4m3"), FP8CPUKernel)):
        y = cls(q, torch.float32)(x)
        y2 = _with_build(module, NO_AVX512, lambda: cls(q, torch.float32)(x))
        assert (not torch.equal(y, y2)) == _avx512(), module.__name__
