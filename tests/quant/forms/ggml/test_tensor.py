"""ggml's block types: quantlab's blocks are llama.cpp's bit for bit (a fixed tensor's, kept from llama.cpp's own
quantizer, and, where llama-cpp-python is installed, fresh tensors against it), the dequantization is gguf-py's
independent one, the bytes are each type's formula, and rows that are not whole blocks take llama.cpp's
substitute type."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import rel_error
from quantlab.errors import UnsupportedError
from quantlab.quant.forms.ggml.kernel import dequantize_blocks, quantize_ggml
from quantlab.quant.forms.ggml.tensor import FLOAT_SUBSTITUTE, GGML_TYPES, GGMLBlockTensor, row_type
from tests.quant.forms.ggml.ggml_llama_cpp import ggml_library, llama_cpp_blocks

REFERENCE = Path(__file__).parent / "ggml_reference"
BLOCK_TYPES = [t for t in GGML_TYPES if t != FLOAT_SUBSTITUTE]
K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _weight(out: int = 48, n_in: int = 768, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, n_in, generator=torch.Generator().manual_seed(seed)) * 0.02


@pytest.mark.parametrize("kind", BLOCK_TYPES)
@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
def test_blocks_are_llama_cpps_for_the_reference_tensor(kind: str, with_imatrix: bool) -> None:
    x = torch.from_numpy(np.load(REFERENCE / "input.npy"))
    imatrix = torch.from_numpy(np.load(REFERENCE / "imatrix.npy")) if with_imatrix else None
    expected = json.loads((REFERENCE / "blocks.json").read_text())["sha256"][f"{kind} {'imatrix' if with_imatrix else 'plain'}"]
    blocks = quantize_ggml(x, kind, imatrix).blocks
    assert hashlib.sha256(blocks.numpy().tobytes()).hexdigest() == expected


@pytest.mark.llama_cpp
@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_blocks_are_llama_cpps_for_fresh_tensors(kind: str) -> None:
    lib = ggml_library()
    if lib is None:
        pytest.skip("llama-cpp-python is not installed")
    block = GGML_TYPES[kind].block
    for seed, n_in in ((1, 4 * block if block == 256 else 576), (2, 1536)):
        x = _weight(24, n_in, seed) * torch.linspace(0.2, 5, n_in)  # columns of different scales
        imatrix = torch.rand(n_in, generator=torch.Generator().manual_seed(seed)) ** 3 * 10
        for weights in (None, imatrix):
            theirs = llama_cpp_blocks(lib, GGML_TYPES[kind].ggml_id, x.numpy(), None if weights is None else weights.numpy())
            assert np.array_equal(quantize_ggml(x, kind, weights).blocks.numpy(), theirs), (kind, n_in, weights is None)


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_dequantization_is_gguf_pys_and_ggmls(kind: str) -> None:
    gguf = pytest.importorskip("gguf")
    q = quantize_ggml(_weight(), kind)
    theirs = gguf.quants.dequantize(q.blocks.numpy(), getattr(gguf.GGMLQuantizationType, kind))
    assert np.array_equal(q.dequantize().numpy(), theirs.astype(np.float32))
    assert torch.equal(dequantize_blocks(q.blocks, kind, 768), q.dequantize())  # ggml's C decoder, the same numbers
    assert torch.equal(q.dequantize(rows=slice(5, 17)), q.dequantize()[5:17])


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_bytes_are_the_block_formula(kind: str) -> None:
    t = GGML_TYPES[kind]
    q = quantize_ggml(_weight(48, 1536), kind)
    assert q.nbytes == q.layout_nbytes() == 48 * 1536 // t.block * t.block_bytes
    bits = {"Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q8_0": 8.5, "Q2_K": 2.625, "Q3_K": 3.4375,
            "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625, "IQ4_NL": 4.5, "IQ4_XS": 4.25}
    assert q.bits_per_weight == bits[kind]


def test_more_bits_err_less() -> None:
    w = _weight(64, 1024)
    errors = [rel_error(quantize_ggml(w, k).dequantize(), w) for k in [*K_QUANTS, "Q8_0"]]
    assert errors == sorted(errors, reverse=True) and errors[0] < 0.35 and errors[-1] < 0.006
    assert rel_error(quantize_ggml(w, "IQ4_NL").dequantize(), w) < rel_error(quantize_ggml(w, "Q4_0").dequantize(), w)


@pytest.mark.parametrize("kind", ["Q3_K", "Q4_K", "Q6_K", "IQ4_XS", "Q4_0"])
def test_an_importance_matrix_lowers_the_error_it_weighs(kind: str) -> None:
    w = _weight(64, 1024)
    imatrix = torch.rand(1024, generator=torch.Generator().manual_seed(3)) ** 6 * 100

    def weighted(q: GGMLBlockTensor) -> float:
        return ((q.dequantize() - w) ** 2 * imatrix).sum().item()

    assert weighted(quantize_ggml(w, kind, imatrix)) < 0.95 * weighted(quantize_ggml(w, kind))


def test_rows_that_are_not_whole_blocks_take_llama_cpps_substitute() -> None:
    assert [row_type(k, 576) for k in K_QUANTS + ["IQ4_XS", "Q8_0"]] == \
        ["Q4_0", "Q4_0", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q8_0"]
    assert [row_type(k, 1536) for k in K_QUANTS] == K_QUANTS
    assert row_type("Q4_K", 100) == row_type("Q4_0", 100) == FLOAT_SUBSTITUTE
    w = _weight(8, 100)
    f16 = quantize_ggml(w, FLOAT_SUBSTITUTE)
    assert f16.nbytes == 8 * 100 * 2 and torch.equal(f16.dequantize(), w.half().float())
    with pytest.raises(UnsupportedError, match="whole blocks of 256"):
        quantize_ggml(_weight(8, 576), "Q4_K")
