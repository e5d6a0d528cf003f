"""The in-process sensitivity scan against quantizing each group for real and measuring the divergence."""
import copy

import pytest
import torch

from quantlab import quantize_
from quantlab.extend import WEIGHT_FORMATS
from quantlab.fidelity.divergence import compare, reference
from quantlab.quant.apply import select_linears
from quantlab.quant.format import Calibration
from quantlab.quant.mixed.groups import group_linears
from quantlab.quant.mixed.sensitivity import scan
from tests.conftest import make_llama

CPU = torch.device("cpu")


def _samples(n: int, seq: int = 32, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (1, seq), generator=g) for _ in range(n)]


def _direct(model, fmt, group, samples, calibration=None):
    """The divergence of the model with only ``group`` in ``fmt``, by quantizing a copy the ordinary way."""
    ids = torch.cat([s.reshape(-1) for s in samples])
    ref = reference(model, ids, samples[0].shape[-1], 4, CPU, 128, what=None)
    variant = copy.deepcopy(model)
    quantize_(variant, fmt.model_copy(update={"include": group.patterns}), calibration)
    return compare(variant, ids, ref, 4, CPU, what=None)


def test_each_row_equals_quantizing_that_group_alone_also_behind_replayed_layers() -> None:
    model = make_llama(num_hidden_layers=3)
    names = select_linears(model)[0]
    groups = group_linears(model, names, "module")
    fmt = WEIGHT_FORMATS["int3"].build(group_size=32)
    samples = _samples(6)
    calls = []
    model.model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    rows = scan(model, groups, [fmt], samples, None)
    assert len(calls) == 2 * (1 + 7)  # 2 batches: the reference and layer 0's 7 linears; later layers replay it
    assert [r["group"] for r in rows] == names and {r["format"] for r in rows} == {fmt.scheme_label}
    for group, row in zip(groups, rows):
        if group.kind in ("v_proj", "down_proj"):  # layers 0, 1 and 2: none, one and two layers replayed
            direct = _direct(model, fmt, group, samples)
            assert row["kl_divergence_mean"] == pytest.approx(direct["kl_divergence_mean"], rel=1e-5)
            assert row["top1_agreement_percent"] == pytest.approx(direct["top1_agreement_percent"])
    assert all(r["kl_divergence_mean"] > 0 for r in rows)
    # the model is left as it was
    assert all(type(model.get_submodule(n)) is torch.nn.Linear for n in names)
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in model.model.layers)


def test_groups_by_layer_and_a_format_that_keeps_linears_as_they_are() -> None:
    model = make_llama(num_hidden_layers=2)
    groups = group_linears(model, select_linears(model)[0], "layer")
    assert [g.name for g in groups] == ["layer 0", "layer 1"] and len(groups[1].modules) == 7
    samples = _samples(4)
    rows = scan(model, groups, [WEIGHT_FORMATS["int2"].build(group_size=32), WEIGHT_FORMATS["fp32"].build()], samples, None)
    int2, kept = rows[:2], rows[2:]
    direct = _direct(model, WEIGHT_FORMATS["int2"].build(group_size=32), groups[1], samples)
    assert int2[1]["kl_divergence_mean"] == pytest.approx(direct["kl_divergence_mean"], rel=1e-5)
    assert [r["kl_divergence_mean"] for r in kept] == [0.0, 0.0]


def test_a_calibrated_format_is_solved_once_and_each_group_takes_its_linears_from_that_pass(monkeypatch) -> None:
    from quantlab.quant.formats import gptq

    model = make_llama(num_hidden_layers=2)
    names = select_linears(model)[0]
    groups = group_linears(model, names, "module")
    fmt = WEIGHT_FORMATS["gptq"].build(bits=3, group_size=32)
    calibration = Calibration(_samples(8, 64, seed=2))
    passes = []
    solve = gptq.GPTQFormat.apply_
    monkeypatch.setattr(gptq.GPTQFormat, "apply_", lambda self, *a: passes.append(1) or solve(self, *a))
    samples = _samples(4)
    rows = scan(model, groups, [fmt], samples, calibration)
    assert len(passes) == 1 and len(rows) == len(names)
    # the first linear of the first layer sees the same calibration inputs either way: equal to quantizing it alone
    direct = _direct(model, fmt, groups[0], samples, calibration)
    assert rows[0]["kl_divergence_mean"] == pytest.approx(direct["kl_divergence_mean"], rel=1e-4)
