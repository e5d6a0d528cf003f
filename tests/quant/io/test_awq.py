"""AWQ GEMM export: quantlab's own reader of published AWQ checkpoints gives back the exported codes exactly, and
the folder loads through the checkpoint weight format to the measured logits."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quantlab import UnsupportedError, export_, quantize_
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.formats.checkpoint import CheckpointSettings
from quantlab.quant.forms.affine.awq_layout import from_awq_tensors, pack_awq, unpack_awq
from tests.conftest import make_llama

IDS = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(0))


def test_packing_is_the_inverse_of_the_readers_unpacking() -> None:
    codes = torch.randint(0, 16, (64, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    words = pack_awq(codes)
    assert words.shape == (64, 4) and words.dtype == torch.int32
    assert torch.equal(unpack_awq(words, 4), codes)


@pytest.mark.parametrize("symmetric,dtype", [(False, "bfloat16"), (True, None)])
def test_an_exported_folder_reads_back_to_the_measured_model(tmp_path: Path, symmetric: bool, dtype) -> None:
    model = make_llama()
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=64, symmetric=symmetric, compute_dtype=dtype))
    export_(model, "awq", tmp_path)
    settings = CheckpointSettings.read(tmp_path)
    assert (settings.method, settings.bits, settings.group_size) == ("awq", 4, 64)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.0.mlp.up_proj"
    back = from_awq_tensors({k: tensors[f"{name}.{k}"] for k in ("qweight", "qzeros", "scales")}, 4, 64)
    ours = model.get_submodule(name).kernel.stored()
    assert torch.equal(back.codes(), ours.codes()) and torch.equal(back.row_zero_points(), ours.row_zero_points())
    again = make_llama()
    quantize_(again, WEIGHT_FORMATS["checkpoint"].build(path=str(tmp_path)))  # float32 activations
    with torch.no_grad():
        measured, loaded = model(IDS).logits.float(), again(IDS).logits.float()
    assert (loaded - measured).abs().max() <= 2e-2 * measured.abs().max()


def test_groups_that_do_not_divide_the_input_are_refused(tmp_path: Path) -> None:
    model = make_llama(hidden_size=96, intermediate_size=192, num_attention_heads=4)
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=64))
    with pytest.raises(UnsupportedError, match="groups that divide the input"):
        export_(model, "awq", tmp_path)
