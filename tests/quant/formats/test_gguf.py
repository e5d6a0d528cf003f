"""The gguf weight format: each linear in the asked ggml type or llama.cpp's substitute, its bytes the type's
formula, and with ``imatrix`` an importance matrix from the calibration that lowers the error it weighs."""
import functools

import numpy as np
import pytest
import torch

from quantlab import calibration_from_text, quantize_
from quantlab.engine.memory import weight_bytes, weight_bytes_analytic
from quantlab.models import ModelSpec, load_model
from quantlab.quant.calibrate.imatrix import ImatrixAccumulator, collect_imatrix
from quantlab.quant.format import Calibration, build_format
from quantlab.quant.forms.ggml.kernel import dot_products_available, repack_available
from quantlab.quant.linear import QuantizedLinear, linear_weight

CPU = torch.device("cpu")


def _bundled() -> torch.nn.Module:
    return load_model(ModelSpec(bundled="tiny-stdlib-llama"), CPU).model


@functools.lru_cache(maxsize=1)
def _calibration() -> Calibration:
    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"), CPU)
    return calibration_from_text(loaded.tokenizer, "stdlib-train", samples=4, seq_len=64, seed=0)


def _types(model: torch.nn.Module) -> dict[str, str]:
    return {n: m.kernel.stored().ggml_type for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}


def test_each_linear_takes_the_type_or_llama_cpps_substitute_with_its_bytes() -> None:
    model = _bundled()
    report = quantize_(model, build_format({"format": "gguf", "type": "Q4_K"}))
    types = _types(model)
    assert {t for n, t in types.items() if n.endswith("down_proj")} == {"Q5_0"}  # 640 inputs: not whole 256s
    assert {t for n, t in types.items() if not n.endswith("down_proj")} == {"Q4_K"}
    assert report.details["model.layers.0.mlp.down_proj"] == {"ggml_type": "Q5_0"}
    assert weight_bytes(model) == weight_bytes_analytic(model)
    q_proj = model.get_submodule("model.layers.0.self_attn.q_proj")
    assert q_proj.kernel_path == ("ggml_repack_cpu" if repack_available("Q4_K") else "ggml_cpu")
    assert q_proj.kernel.stored().nbytes == 256 * 256 // 256 * 144
    down = model.get_submodule("model.layers.0.mlp.down_proj")  # Q5_0: no repacked layout, a row at a time
    assert down.kernel_path == ("ggml_q8_cpu" if dot_products_available() else "ggml_cpu")


def test_labels_name_the_type_and_the_importance_matrix() -> None:
    assert build_format({"format": "gguf", "type": "Q6_K"}).label == "gguf-q6_k"
    fmt = build_format({"format": "gguf", "type": "IQ4_XS", "imatrix": True})
    assert fmt.label == "gguf-iq4_xs-imat" and fmt.needs_calibration
    assert not build_format({"format": "gguf", "type": "Q4_0"}).needs_calibration
    with pytest.raises(ValueError, match="Q4_K"):
        build_format({"format": "gguf", "type": "Q4_K_M"})


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_the_importance_matrix_is_the_mean_squared_input_of_each_column() -> None:
    acc = ImatrixAccumulator(3)
    a, b = torch.randn(2, 5, 3), torch.randn(7, 3)
    acc.add(a)
    acc.add(b)
    assert acc.rows == 17
    assert torch.allclose(acc.mean(), torch.cat([a.reshape(-1, 3), b]).square().mean(0))
    model, calibration = _bundled(), _calibration()
    name = "model.layers.2.mlp.down_proj"
    seen = []
    hook = model.get_submodule(name).register_forward_pre_hook(lambda _m, args: seen.append(args[0].reshape(-1, 640)))
    sums = collect_imatrix(model, [name, "model.layers.0.self_attn.q_proj"], calibration)
    hook.remove()
    tokens = sum(s.numel() for s in calibration)
    assert sums[name].rows == sums["model.layers.0.self_attn.q_proj"].rows == tokens
    assert torch.allclose(sums[name].mean(), torch.cat(seen).square().mean(0), rtol=1e-5)


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_an_importance_matrix_lowers_the_error_it_weighs_over_the_model() -> None:
    calibration = _calibration()
    reference = _bundled()
    names = [n for n, m in reference.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    sums = collect_imatrix(reference, names, calibration)
    weighted = {}
    for imatrix in (False, True):
        model = _bundled()
        report = quantize_(model, build_format({"format": "gguf", "type": "Q3_K", "imatrix": imatrix}), calibration)
        if imatrix:
            assert all(d["imatrix_tokens"] == sums[n].rows for n, d in report.details.items())
        weighted[imatrix] = sum(
            (((model.get_submodule(n).dequantize_weight() - linear_weight(reference.get_submodule(n))) ** 2)
             * sums[n].mean()).sum().item() for n in names)
    assert weighted[True] < 0.9 * weighted[False]


@pytest.mark.slow  # several seconds; CI's slow tier runs it
def test_the_importance_matrix_file_is_llama_cpps_layout_and_reads_back_to_the_same_blocks(tmp_path) -> None:
    gguf = pytest.importorskip("gguf")
    from quantlab.quant.io.imatrix import read_imatrix

    calibration, path = _calibration(), tmp_path / "imatrix.gguf"
    written = _bundled()
    fmt = build_format({"format": "gguf", "type": "Q4_K", "imatrix": True, "imatrix_path": str(path)})
    quantize_(written, fmt, calibration)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.type"].contents() == "imatrix" and "general.architecture" not in reader.fields
    assert reader.fields["imatrix.chunk_size"].contents() == 64
    tensors = {t.name: t for t in reader.tensors}
    q = tensors["blk.0.attn_q.weight.in_sum2"]
    assert q.tensor_type == gguf.GGMLQuantizationType.F32 and list(q.shape) == [256, 1]  # ggml's ne: [n, matrices]
    assert float(np.array(tensors["blk.0.attn_q.weight.counts"].data).item()) == sum(s.numel() for s in calibration)
    again = _bundled()  # read back instead of collected: the very same blocks
    report = quantize_(again, fmt, calibration)
    assert report.details["model.layers.0.self_attn.q_proj"]["imatrix_file"] == str(path)
    for name, module in written.named_modules():
        if isinstance(module, QuantizedLinear):
            assert torch.equal(module.kernel.stored().blocks, again.get_submodule(name).kernel.stored().blocks), name
    means = read_imatrix(path)
    assert set(means) >= {"blk.5.ffn_down.weight", "blk.0.attn_v.weight"} and means["blk.5.ffn_down.weight"].shape == (640,)


def test_the_older_dat_imatrix_reads_as_llama_quantize_reads_it(tmp_path) -> None:
    """The legacy file: per entry the name, the chunk count and the mean squared input times that count."""
    import struct

    from quantlab.quant.io.imatrix import read_imatrix

    mean = np.array([0.5, 2.0, 4.0], dtype=np.float32)
    name = b"blk.0.attn_q.weight"
    blob = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 10, 3) + (mean * 10).tobytes()
    blob += struct.pack("<i", 10) + struct.pack("<i", 4) + b"text"
    (tmp_path / "old.dat").write_bytes(blob)
    assert torch.allclose(read_imatrix(tmp_path / "old.dat")["blk.0.attn_q.weight"], torch.from_numpy(mean))
