"""Mixed precision over GGUF types, sized against one of llama.cpp's named mixes: the whole file's tensors (the
output head and a tied table it holds included) within the named mix's, one importance matrix shared by every
candidate, and the scan scoring a tied head with the lookup that reads its blocks."""
import copy

import pytest
import torch

from quantlab import quantize_
from quantlab.engine.memory import weight_bytes_analytic
from quantlab.extend import WEIGHT_FORMATS
from quantlab.fidelity.divergence import compare, reference
from quantlab.quant.apply import select_linears
from quantlab.quant.calibrate import imatrix as imatrix_module
from quantlab.quant.embedding import BlockEmbedding, block_embedding_
from quantlab.quant.format import Calibration, build_format
from quantlab.quant.forms.ggml.kernel import quantize_ggml
from quantlab.quant.linear import QuantizedLinear, linear_weight
from quantlab.quant.mixed.groups import group_linears
from quantlab.quant.mixed.sensitivity import scan
from tests.conftest import make_llama

CPU = torch.device("cpu")
TYPES = ["Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _calibration(n: int = 4, seq: int = 64) -> Calibration:
    g = torch.Generator().manual_seed(0)
    return Calibration([torch.randint(0, 4096, (1, seq), generator=g) for _ in range(n)])


def _mix(imatrix: bool = False, **fields):
    candidates = [{"format": "gguf", "type": t, **({"imatrix": True} if imatrix else {})} for t in TYPES]
    return WEIGHT_FORMATS["mixed"].build(candidates=candidates, budget_format={"format": "gguf", "recipe": "Q4_K_M"},
                                         scan_tokens=128, **fields)


def _file_bytes(model: torch.nn.Module) -> int:
    """Every tensor's bytes as a GGUF file holds them: the linears, the head, the table once, the norms."""
    return weight_bytes_analytic(model) - sum(b.numel() * b.element_size() for name, b in model.named_buffers()
                                              if "rotary" in name)


def test_a_tied_head_in_the_mix_holds_the_table_and_the_file_stays_within_the_named_mix_s() -> None:
    calibration = _calibration()
    named = make_llama(hidden_size=256)
    quantize_(named, build_format({"format": "gguf", "recipe": "Q4_K_M"}))
    mixed = make_llama(hidden_size=256)
    report = quantize_(mixed, _mix(head=True), calibration)
    # Kept in float, the tied head would leave the float table (4 MB here) in a file the named mix holds in 1.6 MB:
    # priced at nothing, as before the table was counted, the knapsack kept it and spent its bytes on the body.
    assert "lm_head" in report.replaced
    lookup = mixed.get_input_embeddings()
    assert isinstance(lookup, BlockEmbedding) and lookup.tied
    assert report.details["model.embed_tokens"]["tied_to_head"]
    budget = _file_bytes(named)
    assert 0.9 * budget <= _file_bytes(mixed) <= budget


def test_an_untied_table_is_stored_as_the_budget_format_stores_it() -> None:
    model = make_llama(hidden_size=256, tie_word_embeddings=False)
    table = model.get_input_embeddings().weight.detach().clone()
    report = quantize_(model, _mix(), _calibration())
    assert report.details["model.embed_tokens"] == {"ggml_type": "Q4_K"}  # Q4_K_M's default type, as llama.cpp's
    assert torch.equal(model.get_input_embeddings().blocks, quantize_ggml(table, "Q4_K").blocks)
    assert WEIGHT_FORMATS["mixed"].build(candidates=["int8", "int4"], bits_per_weight=5.0).embedding_format is None


def test_every_candidate_quantizes_with_one_importance_matrix_of_the_unquantized_model(monkeypatch) -> None:
    calibration = _calibration()
    model = make_llama(hidden_size=256, num_hidden_layers=4)
    original = copy.deepcopy(model)
    names = select_linears(model)[0]
    truth = imatrix_module.collect_imatrix(original, names, calibration)
    collections = []
    real = imatrix_module.collect_imatrix

    def counted(*args, **kwargs):
        collections.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("quantlab.quant.formats.gguf.collect_imatrix", counted)
    fmt = _mix(imatrix=True, sensitivity_path=None)
    report = quantize_(model, fmt, calibration)
    used = {d["format"] for d in report.details.values() if "format" in d}
    assert len(used) >= 2  # the budget mixes candidates, so more than one applies
    # one collection for the scan's candidates and one for the application, whatever the number of candidates
    assert len(collections) == 2
    for name in names:
        module = model.get_submodule(name)
        assert isinstance(module, QuantizedLinear) and module.settings["imatrix"]
        kind = module.settings["ggml_type"]
        expected = quantize_ggml(linear_weight(original.get_submodule(name)), kind, truth[name].mean())
        assert torch.equal(module.kernel.stored().blocks, expected.blocks), name


def test_the_scan_scores_a_tied_head_with_the_lookup_that_reads_its_blocks() -> None:
    model = make_llama(hidden_size=256)
    fmt = build_format({"format": "gguf", "type": "Q3_K"})
    groups = group_linears(model, ["lm_head"], "module")
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 4096, (1, 32), generator=g) for _ in range(4)]
    row, = scan(model, groups, [fmt], samples, None)
    ids = torch.cat([s.reshape(-1) for s in samples])
    ref = reference(model, ids, 32, 4, CPU, 128, what=None)
    variant = copy.deepcopy(model)
    variant.set_submodule("lm_head", fmt.quantize_module("lm_head", variant.lm_head))
    head_only = compare(variant, ids, ref, 4, CPU, what=None)["kl_divergence_mean"]
    assert block_embedding_(variant) is not None  # the table now read from the head's blocks, as applied
    both = compare(variant, ids, ref, 4, CPU, what=None)["kl_divergence_mean"]
    assert row["kl_divergence_mean"] == pytest.approx(both, rel=1e-5)
    assert both > head_only  # the rounded table costs divergence the head alone does not show
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)  # the scan put the model back
