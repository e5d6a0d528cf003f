"""The hadamard transform: its rotation is compressed-tensors' Hadamard matrix (deterministic and random-signed,
powers of two and the known-factor sizes), the transform alone leaves the model's logits unchanged, and rounding
the rotated weight of a heavy-tailed layer loses less than rounding the weight itself."""
import copy
import math

import pytest
import torch

from quantlab import UnsupportedError, quantize_
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.format import build_format
from quantlab.quant.transforms import TRANSFORMS
from tests.conftest import make_llama

ct = pytest.importorskip("compressed_tensors.transform.utils.hadamard")


@pytest.mark.parametrize("n", [64, 576, 640, 1536])
@pytest.mark.parametrize("randomize", [False, True])
def test_the_rotation_is_compressed_tensors_hadamard_matrix(n: int, randomize: bool) -> None:
    t = TRANSFORMS["hadamard"].build(randomize=randomize, seed=3)
    rotation = t.input_module(n, torch.device("cpu"))
    if randomize:
        matrix = ct.random_hadamard_matrix(n, torch.float64, gen=torch.Generator().manual_seed(3))
    elif n & (n - 1) == 0:
        matrix = ct.deterministic_hadamard_matrix(n, torch.float64)
    else:  # the same construction without signs
        matrix = ct._matmul_hadU(torch.eye(n, dtype=torch.float64))
    x = torch.randn(5, n, dtype=torch.float64)
    want = (x @ matrix / math.sqrt(n)).float()
    assert torch.allclose(rotation(x.float()), want, atol=1e-5, rtol=1e-5)
    eye = rotation(torch.eye(n))
    assert torch.allclose(eye @ eye.T, torch.eye(n), atol=1e-5)  # orthogonal


@pytest.mark.parametrize("n,block", [(576, 16), (1536, 32), (640, 64)])
def test_a_block_rotation_is_compressed_tensors_block_diagonal_matrix(n: int, block: int) -> None:
    t = TRANSFORMS["hadamard"].build(randomize=True, seed=3, block_size=block)
    rotation = t.input_module(n, torch.device("cpu"))
    small = ct.random_hadamard_matrix(block, torch.float64, gen=torch.Generator().manual_seed(3))
    x = torch.randn(5, n, dtype=torch.float64)
    want = (x @ torch.block_diag(*[small] * (n // block)) / math.sqrt(block)).float()
    assert torch.allclose(rotation(x.float()), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(rotation.matrix(), small.float().round())  # what an export writes: one block
    with pytest.raises(UnsupportedError, match="block_size 128 does not divide a linear.s 576 inputs"):
        TRANSFORMS["hadamard"].build(block_size=128).input_module(576, torch.device("cpu"))


def test_the_transform_alone_leaves_the_logits_unchanged() -> None:
    model = make_llama(num_hidden_layers=2, hidden_size=192, num_attention_heads=3, num_key_value_heads=3,
                       intermediate_size=320).eval()  # inputs of 192 and 320: known-factor sizes
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        for transforms in (["hadamard"], [{"name": "hadamard", "randomize": True}, "hadamard"],
                           [{"name": "hadamard", "randomize": True, "block_size": 16}]):
            rotated = copy.deepcopy(model)
            quantize_(rotated, build_format({"format": "cast", "dtype": "float32", "transforms": transforms}))
            weight = rotated.model.layers[0].mlp.down_proj.weight
            assert not torch.allclose(weight, model.model.layers[0].mlp.down_proj.weight)  # rotated in place
            assert torch.allclose(rotated(ids).logits, want, atol=2e-5, rtol=1e-4)


def test_rounding_a_rotated_heavy_tailed_weight_loses_less() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(576, 256, bias=False))
    w = torch.distributions.StudentT(2.0).sample((256, 576)) * 0.02  # a row's scale set by its few largest weights
    layer[0].weight.data = w.clone()
    errors = {}
    for transforms in ([], ["hadamard"]):
        q = copy.deepcopy(layer)
        quantize_(q, build_format({"format": "int3", "group_size": None, "transforms": transforms}))
        errors[bool(transforms)] = ((q[0].dequantize_weight() - w).norm() / w.norm()).item()
    assert errors[True] < 0.6 * errors[False], errors


def test_gptq_sees_the_rotated_inputs_and_the_layer_applies_what_it_measured() -> None:
    model = make_llama(num_hidden_layers=1, hidden_size=128, num_attention_heads=2, intermediate_size=256).eval()
    samples = [torch.randint(0, 4096, (1, 64), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    q = copy.deepcopy(model)
    quantize_(q, build_format({"format": "gptq", "bits": 4, "group_size": 32, "transforms": ["hadamard"]}), samples)
    down = q.model.layers[0].mlp.down_proj
    x = torch.randn(3, 256)
    assert torch.allclose(down(x), x @ down.dequantize_weight().T, atol=1e-4, rtol=1e-3)  # the weight it applies
    original = model.model.layers[0].mlp.down_proj.weight
    assert ((down.dequantize_weight() - original).norm() / original.norm()).item() < 0.2


def test_the_recipe_form_labels_and_refusals() -> None:
    fmt = build_format({"format": "int4", "group_size": 32, "transforms": [{"name": "hadamard", "randomize": True}]})
    assert fmt.label == "int4-g32-asym-hadr0" and fmt.exports == ("compressed-tensors",)  # the rotation carried
    blocks = build_format({"format": "nvfp4", "transforms": [{"name": "hadamard", "randomize": True, "block_size": 16}]})
    assert blocks.label.endswith("-hadr0b16") and build_format(WEIGHT_FORMATS.recipe_entry(blocks)) == blocks
    assert "hadr0 acts on each input at run time, which gguf does not carry" in fmt.export_refusal("gguf")
    assert build_format(WEIGHT_FORMATS.recipe_entry(fmt)) == fmt
    gptq = build_format({"format": "gptq", "bits": 4, "group_size": 32, "act_order": True, "transforms": ["hadamard"]})
    assert gptq.label.endswith("-act-had") and gptq.label.count("-had") == 1  # once, after the subclass's tags
    with pytest.raises(ValueError, match="takes none"):
        build_format({"format": "mixed", "candidates": ["int8", "int4"], "budget_format": "int4",
                      "transforms": ["hadamard"]})
    with pytest.raises(ValueError, match="transforms\\[0\\]: unknown transform 'rotate-everything'"):
        build_format({"format": "int4", "transforms": ["rotate-everything"]})
