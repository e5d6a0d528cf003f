"""Block-scaled FP8 (``{format: fp8, block_size: 128}``): scales and codes equal compressed-tensors' FP8_BLOCK
(its qparams from each tile's min and max, its quantize), partial tiles at the edges included."""
from __future__ import annotations

import pytest
import torch

from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.forms.float8.tensor import Float8Tensor, quantize_fp8


def _ct_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = PRESET_SCHEMES["FP8_BLOCK"]["weights"]
    b = args.block_structure[0]
    out, n_in = w.shape
    padded = torch.nn.functional.pad(w, (0, -n_in % b, 0, -out % b))
    tiles = padded.view(padded.shape[0] // b, b, padded.shape[1] // b, b)
    scale, zero = calculate_qparams(tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3)), args)
    return scale, quantize(w, scale, zero, args, dtype=torch.float8_e4m3fn)


def test_block_fp8_equals_compressed_tensors_fp8_block(real_weights) -> None:
    pytest.importorskip("compressed_tensors")
    for name, w in {**real_weights, "ragged": torch.randn(200, 300)}.items():
        scale, q = _ct_block(w)
        ours = quantize_fp8(w, block_size=128)
        assert torch.equal(ours.scales, scale.float()), name
        assert torch.equal(ours.data.view(torch.uint8), q.view(torch.uint8)), name


def test_block_fp8_holds_a_scale_per_tile_and_its_label_says_so() -> None:
    q = quantize_fp8(torch.randn(200, 300), block_size=128)
    assert q.scales.shape == (2, 3) and q.nbytes == q.layout_nbytes() == Float8Tensor.analytic_nbytes((200, 300), False, 128)
    fmt = WEIGHT_FORMATS["fp8"].build(block_size=128)
    assert fmt.label == "fp8-e4m3-b128" and fmt.linear_weight_bytes(200, 300, torch.float32) == 200 * 300 + 4 * 6
    with pytest.raises(ValueError, match="excludes per_tensor"):
        WEIGHT_FORMATS["fp8"].build(block_size=128, per_tensor=True)
