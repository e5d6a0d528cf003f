import pytest
import torch

from quantlab import UnsupportedError, gptq_quantize, quantize_, quantize_tensor
from quantlab.extend import WEIGHT_FORMATS
from quantlab.quant.formats.gptq import output_error
from quantlab.quant.forms.affine.tensor import QuantizedTensor
from tests.conftest import make_llama


def _problem(n_in: int = 256, out: int = 64, n: int = 2048, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n_in, n_in, generator=g) / n_in**0.5
    x = torch.randn(n, n_in, generator=g) @ mix + 0.05 * torch.randn(n, n_in, generator=g)
    w = torch.randn(out, n_in, generator=g) * 0.05
    return w, x, 2 * x.T @ x / n


@pytest.mark.parametrize("bits,group_size,act_order", [(4, None, False), (4, 128, False), (4, 64, True), (3, 128, True), (2, 64, False)])
def test_gptq_output_error_is_below_rtn(bits: int, group_size: int | None, act_order: bool) -> None:
    w, x, h = _problem()
    q = gptq_quantize(w, h, bits, group_size, act_order=act_order)
    rtn = quantize_tensor(w, bits, group_size)
    gptq_err = (x @ (w - q.dequantize()).T).pow(2).mean()
    rtn_err = (x @ (w - rtn.dequantize()).T).pow(2).mean()
    assert gptq_err < 0.8 * rtn_err
    assert output_error(w, q, h) == pytest.approx(gptq_err.item() * w.shape[0], rel=1e-3)


def test_identity_hessian_reduces_to_round_to_nearest() -> None:
    w, _, _ = _problem()
    q = gptq_quantize(w, torch.eye(256), 4, 64, damp=1e-6)
    assert torch.equal(q.codes(), quantize_tensor(w, 4, 64, scale_dtype=torch.float32).codes())  # fp32 in the solve


def test_act_order_records_the_group_of_every_column() -> None:
    w, _, h = _problem()
    q = gptq_quantize(w, h, 4, 64, act_order=True)
    assert q.g_idx is not None and q.g_idx.dtype == torch.int32
    assert torch.bincount(q.g_idx.long()).tolist() == [64] * 4
    perm = torch.argsort(h.diagonal(), descending=True)
    assert torch.equal(q.g_idx[perm].long(), torch.arange(256) // 64)
    assert q.nbytes == QuantizedTensor.analytic_nbytes((64, 256), 4, 64, False, 2, act_order=True)


def test_dead_inputs_get_zero_weight_and_finite_scales() -> None:
    w, x, _ = _problem()
    x[:, :10] = 0
    q = gptq_quantize(w, 2 * x.T @ x / x.shape[0], 4, 128)
    assert torch.isfinite(q.scales).all()
    assert torch.equal(q.dequantize()[:, :10], torch.zeros(64, 10))


def test_symmetric_gptq_stores_no_zeros() -> None:
    w, _, h = _problem()
    q = gptq_quantize(w, h, 4, 128, symmetric=True)
    assert q.zeros is None and q.nbytes == 64 * 128 + 64 * 2 * 2


def test_shape_errors() -> None:
    w, _, h = _problem()
    with pytest.raises(UnsupportedError, match="Hessian shape"):
        gptq_quantize(w, h[:10, :10], 4)



def test_a_shorter_last_group_is_solved_too() -> None:
    w, x, h = _problem(n_in=320)
    q = gptq_quantize(w, h, 3, 128)
    assert q.n_groups == 3 and torch.equal(q.g_idx if q.g_idx is not None else torch.arange(320) // 128, torch.arange(320) // 128)
    gptq_err = (x @ (w - q.dequantize()).T).pow(2).mean()
    rtn_err = (x @ (w - quantize_tensor(w, 3, 128).dequantize()).T).pow(2).mean()
    assert gptq_err < 0.8 * rtn_err


def test_sequential_gptq_beats_rtn_on_every_layer() -> None:
    model = make_llama()
    g = torch.Generator().manual_seed(0)
    calibration = [torch.randint(0, 4096, (1, 64), generator=g) for _ in range(8)]
    fmt = WEIGHT_FORMATS["gptq"].build(bits=4, group_size=64)
    report = quantize_(model, fmt, calibration)
    assert len(report.replaced) == 14 and report.kept == ["lm_head"]
    for name, d in report.details.items():
        assert d["calibration_rows"] == 8 * 64
        assert d["output_error_gptq"] <= d["output_error_rtn"], name
    assert fmt.label == "int4-g64-asym-gptq"


def test_gptq_needs_calibration() -> None:
    with pytest.raises(ValueError, match="needs calibration"):
        quantize_(make_llama(), WEIGHT_FORMATS["gptq"].build(bits=4))



def test_a_layers_linears_are_grouped_by_shared_input_in_the_order_they_run() -> None:
    from quantlab.quant.calibrate.layers import execution_groups

    model = make_llama()
    layer = model.model.layers[0]
    names = sorted(n for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear))
    hidden = torch.randn(1, 8, 128)
    kwargs = {"position_embeddings": model.model.rotary_emb(hidden, torch.arange(8)[None]), "attention_mask": None}
    assert execution_groups(layer, names, (hidden,), kwargs) == [
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
        ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]
    # A selected subset keeps the order they run in; a linear that never runs comes last, on its own.
    layer.extra = torch.nn.Linear(128, 128)
    assert execution_groups(layer, ["mlp.down_proj", "extra", "self_attn.o_proj"], (hidden,), kwargs) == [
        ["self_attn.o_proj"], ["mlp.down_proj"], ["extra"]]


def _o_proj_input_hessian(model: torch.nn.Module, calibration: list[torch.Tensor]) -> torch.Tensor:
    from quantlab.quant.calibrate.layers import HessianAccumulator

    acc = HessianAccumulator(128, torch.device("cpu"))
    handle = model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(lambda _m, a: acc.add(a[0]))
    with torch.no_grad():
        for ids in calibration:
            model(input_ids=ids, use_cache=False)
    handle.remove()
    return acc.hessian


@pytest.mark.parametrize("true_sequential", [True, False])
def test_true_sequential_takes_each_groups_hessian_after_the_groups_before_it(true_sequential: bool) -> None:
    from quantlab.quant.calibrate.layers import quantize_sequential_
    from quantlab.quant.linear import QuantizedLinear, linear_weight

    model, reference = make_llama(), make_llama()  # the same seeded weights; reference stays unquantized
    g = torch.Generator().manual_seed(0)
    calibration = [torch.randint(0, 4096, (1, 32), generator=g) for _ in range(4)]
    hessians: dict[str, torch.Tensor] = {}

    def solve(name: str, module: torch.nn.Module, hessian: torch.Tensor) -> torch.nn.Module:
        hessians[name] = hessian.clone()
        return QuantizedLinear.from_linear(module, gptq_quantize(linear_weight(module), hessian, 2, 64))

    selected = [f"model.layers.0.{n}" for n, m in model.model.layers[0].named_modules() if isinstance(m, torch.nn.Linear)]
    stats = quantize_sequential_(model, selected, calibration, solve, true_sequential=true_sequential)
    assert {stats[n]["sequential_group"] for n in selected} == ({0, 1, 2, 3} if true_sequential else {0})
    recorded = hessians["model.layers.0.self_attn.o_proj"]
    # True-sequential: o_proj's Hessian comes from the quantized q/k/v; one pass: from the original ones.
    from_quantized, from_original = _o_proj_input_hessian(model, calibration), _o_proj_input_hessian(reference, calibration)
    assert not torch.allclose(from_quantized, from_original, rtol=1e-3, atol=1e-5)
    expected = from_quantized if true_sequential else from_original
    assert torch.allclose(recorded, expected, rtol=1e-3, atol=1e-5)


def test_the_gptq_label_and_checkpoint_record_the_order_used(tmp_path) -> None:
    import json

    from quantlab import save_gptq

    assert WEIGHT_FORMATS["gptq"].build(bits=4, true_sequential=False).label == "int4-pc-asym-gptq-onepass"
    calibration = [torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    for true_sequential in (True, False):
        model = make_llama()
        fmt = WEIGHT_FORMATS["gptq"].build(bits=4, group_size=64, true_sequential=true_sequential,
                                           kernel="dequantize+matmul")
        quantize_(model, fmt, calibration)
        save_gptq(model, tmp_path / str(true_sequential))
        assert json.loads((tmp_path / str(true_sequential) / "quantize_config.json").read_text())["true_sequential"] is true_sequential
    model = make_llama()
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=64, kernel="dequantize+matmul"))
    save_gptq(model, tmp_path / "rtn")  # round-to-nearest is no sequential method at all
    assert json.loads((tmp_path / "rtn" / "quantize_config.json").read_text())["true_sequential"] is False


GPTQMODEL_CASES = [(None, False), (32, False), (64, True), (128, False)]
GPTQMODEL_SCRIPT = """
import os, sys, torch
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "1")
from gptqmodel.quantization.config import QuantizeConfig
from gptqmodel.quantization.gptq import GPTQ
problem = torch.load(sys.argv[1])
w, x = problem["w"], problem["x"]
out = {}
for group_size, act_order in problem["cases"]:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w.clone()
    g = GPTQ(linear, qcfg=QuantizeConfig(bits=4, group_size=group_size or -1, sym=False, desc_act=act_order,
                                         act_group_aware=False, damp_percent=0.01, damp_auto_increment=0.0))
    g.quantizer.configure(perchannel=True)
    for rows in x.split(512):
        g.add_batch(rows.unsqueeze(0), None)
    out[(group_size, act_order)] = g.quantize()[0].float()
torch.save(out, sys.argv[2])
"""


@pytest.fixture(scope="module")
def gptqmodel_weights(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """GPTQModel's own GPTQ class on ``_problem()`` for every case, in a process of its own (importing GPTQModel
    changes the environment: HF_HOME, allocator and inductor settings that later subprocesses would inherit)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("gptqmodel") is None:
        pytest.skip("needs GPTQModel (quantlab[gptq])")
    folder = tmp_path_factory.mktemp("gptqmodel-solve")
    w, x, _ = _problem()
    torch.save({"w": w, "x": x, "cases": GPTQMODEL_CASES}, folder / "problem.pt")
    done = subprocess.run([sys.executable, "-c", GPTQMODEL_SCRIPT, str(folder / "problem.pt"), str(folder / "out.pt")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(folder / "out.pt")


@pytest.mark.slow  # several seconds (GPTQModel in a subprocess, a whole model); CI's slow tier runs it
@pytest.mark.parametrize("group_size,act_order", GPTQMODEL_CASES)
def test_the_solve_gives_gptqmodels_weights_for_the_same_weight_and_hessian(
    group_size: int | None, act_order: bool, gptqmodel_weights: dict
) -> None:
    """GPTQModel's own GPTQ class on the same weight and calibration rows: the same quantized weight (both with
    float32 scales; GPTQModel's group scales come from the weights as the last block update left them)."""
    w, _, h = _problem()
    ours = gptq_quantize(w, h, 4, group_size, act_order=act_order, scale_dtype=torch.float32)
    torch.testing.assert_close(ours.dequantize(), gptqmodel_weights[(group_size, act_order)], rtol=0, atol=1e-6)
