"""The KV scan on the bundled model: one layer group at a time in a candidate format, KL through the cache against
the baseline cache; orderings, zeros and the whole plan beside its groups' sum."""
import pytest
import torch

from quantlab.data import load_text
from quantlab.eval.tokens import tokenize
from quantlab.extend import KV_FORMATS
from quantlab.models import bundled_models
from quantlab.plan.kv_scan import CacheReference, kv_layer_scan, with_layers

WINDOW, CHUNK = 96, 32


@pytest.fixture(scope="module")
def reference() -> CacheReference:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = bundled_models()["tiny-stdlib-llama"]
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ids = tokenize(AutoTokenizer.from_pretrained(src), load_text("bundled-heldout"))[: 2 * WINDOW]
    return CacheReference(model, ids.view(2, WINDOW), KV_FORMATS["native"].build(), CHUNK, batch_size=2)


def _int(bits: int):
    return KV_FORMATS[f"int{bits}"].build(group_size=32, residual_tokens=0)


def test_each_group_loses_more_at_fewer_bits_and_nothing_in_the_baseline_format(reference: CacheReference) -> None:
    groups = [(0, 1, 2), (3, 4, 5)]
    rows = kv_layer_scan(reference, groups, [KV_FORMATS["native"].build(), _int(8), _int(4)])
    assert len(rows) == 6 and all(r.positions == 2 * (WINDOW - 1) for r in rows)
    by = {(r.layers, r.kv_format.split("-")[0]): r.kl_nats for r in rows}
    for g in groups:
        assert by[(g, "native")] == 0.0
        assert 0 < by[(g, "int8")] < by[(g, "int4")]


def test_a_plan_is_measured_as_its_groups_are(reference: CacheReference) -> None:
    everywhere = with_layers(reference.baseline, tuple(range(6)), _int(8))
    assert reference.kl(everywhere) == reference.kl(_int(8))  # the same cache, layer for layer
    groups = [(0, 1, 2), (3, 4, 5)]
    rows = kv_layer_scan(reference, groups, [_int(4)])
    predicted = sum(r.kl_nats for r in rows)
    measured = reference.kl(_int(4))
    assert 0.5 * predicted < measured < 2 * predicted, (predicted, measured)  # additivity holds roughly, not exactly
