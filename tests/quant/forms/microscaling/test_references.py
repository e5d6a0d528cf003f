"""Bit for bit against the references users trust, on real weights (``real_weights``): torchao's ``to_mx`` in each
of its scale modes and its ``nvfp4_quantize``; compressed-tensors' qparams and quantize as llm-compressor calls
them, and its FP4 packer; ggml's MXFP4 quantizer as the gguf package ships it. Where the references disagree a
field chooses, and each test names the setting that matches."""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

from quantlab.quant.forms.microscaling import quantize_mx, quantize_nvfp4
from quantlab.quant.forms.microscaling.tensor import unpack_nibbles

MODES = ["floor", "even", "ceil", "rceil"]


@pytest.fixture(scope="module")
def torchao_mx():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
            nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
        finally:
            logging.disable(logging.NOTSET)
    return mx, nv


@pytest.mark.parametrize("element", ["e2m1", "e4m3"])
@pytest.mark.parametrize("mode", MODES)
def test_mx_codes_and_scales_equal_torchaos_to_mx_in_each_scale_mode(real_weights, torchao_mx, element, mode) -> None:
    mx, _ = torchao_mx
    dtype = torch.float4_e2m1fn_x2 if element == "e2m1" else torch.float8_e4m3fn
    scale_mode = getattr(mx.ScaleCalculationMode, mode.upper())
    for name, w in real_weights.items():
        scales, data = mx.to_mx(w.contiguous(), dtype, 32, scale_mode)
        ours = quantize_mx(w, element, mode)
        assert torch.equal(scales.view(torch.uint8), ours.scales), name
        assert torch.equal(data.view(torch.uint8), ours.codes.view(torch.uint8)), name


def test_nvfp4_reciprocal_equals_torchaos_nvfp4_quantize_and_divide_differs_in_a_few_last_bits(real_weights,
                                                                                              torchao_mx) -> None:
    _, nv = torchao_mx
    differ = total = 0
    for name, w in real_weights.items():
        per_tensor = nv.per_tensor_amax_to_scale(w.abs().amax())
        scales, data = nv.nvfp4_quantize(w.contiguous(), 16, per_tensor)
        ours = quantize_nvfp4(w, arithmetic="reciprocal")
        assert torch.equal(scales.view(torch.uint8), ours.scales.view(torch.uint8)), name
        assert torch.equal(data, ours.codes), name
        divide = quantize_nvfp4(w)
        differ += (unpack_nibbles(divide.codes) != unpack_nibbles(ours.codes)).sum().item()
        total += w.numel()
    assert differ <= 1e-4 * total  # the same rule in another order of float operations


def _ct_group(w: torch.Tensor, args, global_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' scales and quantized values for a GROUP / TENSOR_GROUP weight, from each group's min and
    max as llm-compressor's min-max observer gives them."""
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    blocks = w.reshape(w.shape[0], -1, args.group_size)
    scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args, global_scale=global_scale)
    return scale, quantize(w, scale, zero, args, global_scale=global_scale)


@pytest.mark.parametrize("preset,element", [("MXFP4", "e2m1"), ("MXFP8", "e4m3")])
def test_mx_with_round_scales_equals_compressed_tensors(real_weights, preset: str, element: str) -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    args = PRESET_SCHEMES[preset]["weights"]
    for name, w in real_weights.items():
        scale, q = _ct_group(w, args)
        ours = quantize_mx(w, element, "round")
        assert torch.equal((torch.log2(scale) + 127).to(torch.uint8), ours.scales), name
        theirs = pack_fp4_to_uint8(q) if element == "e2m1" else q.to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(theirs, ours.codes.view(torch.uint8)), name
        assert torch.equal(ours.dequantize(), (q.reshape(w.shape[0], -1, 32) * scale.unsqueeze(-1)).reshape(w.shape))


def test_nvfp4_equals_compressed_tensors_global_and_block_scales_and_codes(real_weights) -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils.helpers import generate_gparam

    args = PRESET_SCHEMES["NVFP4"]["weights"]
    for name, w in real_weights.items():
        global_scale = generate_gparam(w.amin(), w.amax())
        scale, q = _ct_group(w, args, global_scale)
        ours = quantize_nvfp4(w)
        assert torch.equal(ours.global_scale, global_scale), name
        assert torch.equal(ours.scales.view(torch.uint8), scale.to(torch.float8_e4m3fn).view(torch.uint8)), name
        assert torch.equal(ours.codes, pack_fp4_to_uint8(q)), name


def test_mxfp4_with_ties_to_zero_equals_ggmls_blocks(real_weights) -> None:
    pytest.importorskip("gguf")
    from gguf.quants import MXFP4

    for name, w in real_weights.items():
        blocks = MXFP4.quantize(w.numpy()).reshape(-1, 17)  # [exponent, 16 bytes: element j low, j + 16 high]
        ours = quantize_mx(w, "e2m1", "floor", ties="to_zero")
        codes = unpack_nibbles(ours.codes).reshape(-1, 32)
        expected = np.concatenate([ours.scales.reshape(-1, 1).numpy(),
                                   (codes[:, :16] | (codes[:, 16:] << 4)).numpy()], axis=1)
        assert np.array_equal(blocks, expected), (name, int((blocks != expected).sum()))
    even = quantize_mx(real_weights["heavy_tailed_random"], "e2m1")
    assert not torch.equal(even.codes, quantize_mx(real_weights["heavy_tailed_random"], "e2m1", ties="to_zero").codes)


def _ggml_nvfp4_layout(q) -> np.ndarray:
    """Our NVFP4 tensor in ggml's block layout: per 64, four e4m3 scale bytes, then per 16 element j low, j + 8 high."""
    out, n_in = q.shape
    codes = unpack_nibbles(q.codes).reshape(out, n_in // 64, 4, 16)
    packed = (codes[..., :8] | (codes[..., 8:] << 4)).reshape(out, -1, 32)
    return torch.cat([q.scales.view(torch.uint8).reshape(out, -1, 4), packed], -1).reshape(out, -1).numpy()


def test_nvfp4_ggml_arithmetic_equals_ggmls_quantizer(real_weights) -> None:
    """ggml's ``quantize_row_nvfp4_ref`` (llama.cpp's, through llama-cpp-python's libggml-base) on real weights where
    it is installed; everywhere, the blocks it wrote for ``reference_input()`` (kept in data/, with the command)."""
    from .ggml_nvfp4_reference import BLOCKS, ggml_blocks, reference_input

    x = reference_input()
    kept = np.load(BLOCKS)
    assert np.array_equal(_ggml_nvfp4_layout(quantize_nvfp4(x, arithmetic="ggml")), kept)
    if ggml_blocks(x) is None:
        pytest.skip("llama-cpp-python is not installed: checked against the kept blocks only")
    assert np.array_equal(ggml_blocks(x), kept)
    for name, w in real_weights.items():
        if w.shape[1] % 64 == 0:
            ours = _ggml_nvfp4_layout(quantize_nvfp4(w, arithmetic="ggml"))
            theirs = ggml_blocks(w)
            assert np.array_equal(ours, theirs), (name, int((ours != theirs).sum()))


def test_nvfp4_ggml_blocks_decode_in_gguf_py_to_our_weights() -> None:
    gguf = pytest.importorskip("gguf")
    from .ggml_nvfp4_reference import reference_input

    q = quantize_nvfp4(reference_input(), arithmetic="ggml")
    decoded = gguf.quants.dequantize(_ggml_nvfp4_layout(q), gguf.GGMLQuantizationType.NVFP4)
    assert np.array_equal(decoded, q.dequantize().numpy())
    assert float(q.global_scale) == 1.0  # single-level: the block scales alone
