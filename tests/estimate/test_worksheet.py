from pathlib import Path

import pytest

from quantlab.estimate import estimate, read_architecture, read_raw_config
from quantlab.estimate.evidence import config_object
from quantlab.estimate.inventory import from_formula, from_implementation
from quantlab.extend import KV_FORMATS, WEIGHT_FORMATS

CONFIGS = Path(__file__).parents[2] / "evals" / "configs"
NATIVE = KV_FORMATS["native"].build()
BF16, FP32 = WEIGHT_FORMATS["bf16"].build(), WEIGHT_FORMATS["fp32"].build()

# Published parameter counts of the released checkpoints (tied tensors once).
PARAMS = {
    "gpt2.json": 124_439_808, "llama-3.1-8b.json": 8_030_261_248, "llama-3-70b.json": 70_553_706_496,
    "mistral-7b.json": 7_241_732_096, "gemma-3-1b.json": 999_885_952, "qwen2.5-7b.json": 7_615_616_512,
    "phi-3-mini-4k.json": 3_821_079_552,
}
# KV bytes per position at batch 1 in bf16: 2 (K, V) x layers x KV heads x head width x 2 bytes.
KV_PER_TOKEN = {
    "gpt2.json": 2 * 12 * 12 * 64 * 2, "llama-3.1-8b.json": 2 * 32 * 8 * 128 * 2, "llama-3-70b.json": 2 * 80 * 8 * 128 * 2,
    "mistral-7b.json": 2 * 32 * 8 * 128 * 2, "gemma-3-1b.json": 2 * 26 * 1 * 256 * 2,
    "qwen2.5-7b.json": 2 * 28 * 4 * 128 * 2, "phi-3-mini-4k.json": 2 * 32 * 32 * 96 * 2,
}


def test_seed_000_gemma3_1b_kv_cache_at_32k_tokens() -> None:
    est = estimate(str(CONFIGS / "gemma-3-1b.json"), [], [NATIVE], seq_len=32_768, batch=1)
    assert est.dtype == "bfloat16"
    assert est.kv[0].bytes_full == 872_415_232  # 0.8125 GiB: every layer stores every position
    assert est.kv[0].bytes_retained == 145_752_064  # 4 global x 32,768 + 22 local x 512
    assert "1,024·[4·32768 + 22·512] = 145,752,064 B" in est.kv_formula()


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_every_shipped_config_gives_the_published_parameter_count_and_kv_bytes(name: str) -> None:
    est = estimate(str(CONFIGS / name), [FP32, BF16], [NATIVE], seq_len=1024, dtype="bfloat16")
    assert est.param_count == PARAMS[name]
    assert sum(est.inventory.params_by_component().values()) == PARAMS[name]
    # rotary inverse frequencies stay float32 in a bf16 model (as transformers loads them); other buffers follow
    rotary = sum(n for b, n, dtype in est.inventory.buffers if b.endswith("inv_freq"))
    other = sum(n for b, n, dtype in est.inventory.buffers if dtype.is_floating_point and not b.endswith("inv_freq"))
    assert est.weights[0].bytes == 4 * (PARAMS[name] + rotary + other)
    assert est.weights[1].bytes == 2 * (PARAMS[name] + other) + 4 * rotary
    assert est.kv[0].bytes_full == KV_PER_TOKEN[name] * 1024
    assert not est.architecture.not_interpreted


def test_sliding_layers_retain_their_window_only_past_it() -> None:
    mistral = estimate(str(CONFIGS / "mistral-7b.json"), [], [NATIVE], seq_len=8192)
    assert mistral.kv[0].bytes_full == 2 * mistral.kv[0].bytes_retained  # window 4096 in all layers
    short = estimate(str(CONFIGS / "mistral-7b.json"), [], [NATIVE], seq_len=4096)
    assert short.kv[0].bytes_full == short.kv[0].bytes_retained


def test_quantized_payload_counts_scales_and_zero_points() -> None:
    int4 = WEIGHT_FORMATS["int4"].build(group_size=128)
    int4_sym = WEIGHT_FORMATS["int4"].build(group_size=128, symmetric=True)
    est = estimate(str(CONFIGS / "llama-3.1-8b.json"), [BF16, int4, int4_sym], [], seq_len=1)
    bf16, asym, sym = est.weights
    # Every Llama-3.1-8B input width divides by 128 and every row's 32+ groups pack whole bytes of zero points.
    assert asym.bits_per_quantized_weight == pytest.approx(4 + (16 + 4) / 128)
    assert sym.bits_per_quantized_weight == pytest.approx(4 + 16 / 128)
    kept = bf16.bytes - bf16.quantized_bytes  # embeddings, head, norms stay bf16 (rotary buffers float32)
    assert asym.bytes == kept + asym.quantized_bytes
    rotary = sum(n for _, n, _ in est.inventory.buffers)
    assert kept == 2 * (2 * 128_256 * 4096 + (2 * 32 + 1) * 4096) + 4 * rotary


def test_the_decoder_formula_agrees_with_the_implementation_for_llama_and_mistral() -> None:
    for name in ("llama-3.1-8b.json", "mistral-7b.json", "gemma-3-1b.json"):
        raw, _ = read_raw_config(str(CONFIGS / name))
        implemented = from_implementation(config_object(raw))
        formula = from_formula(read_architecture(raw))
        if name.startswith("gemma"):  # four norms per layer and q/k norms: the formula is for Llama-style blocks
            assert formula.param_count != implemented.param_count
            continue
        assert formula.params_by_component() == implemented.params_by_component()


def test_an_unknown_architecture_still_estimates_the_kv_cache_it_can() -> None:
    from quantlab.estimate import estimate_from_raw

    raw = {"model_type": "mystery-lm", "n_layers": 4, "n_heads": 8, "num_kv_heads": 2, "head_dim": 64,
           "d_model": 512, "max_seq_len": 2048}
    est = estimate_from_raw(raw, "mystery.json", [BF16], [NATIVE], seq_len=2048)
    assert est.inventory is None and est.weights == []
    assert any("attention pattern" in x for x in est.architecture.not_interpreted)
    raw["sliding_window"] = None
    raw["layer_types"] = ["full_attention"] * 4
    est = estimate_from_raw(raw, "mystery.json", [BF16], [NATIVE], seq_len=2048)
    assert est.kv[0].bytes_full == 2 * 4 * 2 * 64 * 2048 * 4  # float32: the file names no dtype, and says so
    assert est.architecture.row("stored dtype").kind == "assumption"
    assert any("parameter count" in x for x in est.architecture.not_interpreted)


def test_mlp_kind_is_read_off_the_implementations_modules() -> None:
    kinds = {}
    for name in ("gpt2.json", "gemma-3-1b.json", "phi-3-mini-4k.json"):
        row = estimate(str(CONFIGS / name), [], [], seq_len=1).architecture.row("MLP kind")
        kinds[name] = (row.value, row.kind)
    assert kinds["gpt2.json"] == ("not gated (c_fc, c_proj)", "implementation")
    assert kinds["gemma-3-1b.json"] == ("gated (gate_proj, up_proj, down_proj)", "implementation")
    assert kinds["phi-3-mini-4k.json"] == ("gated (gate_up_proj, down_proj)", "implementation")  # fused gate and up


def test_a_format_without_a_byte_formula_is_reported_not_guessed() -> None:
    from quantlab.quant.format import WeightFormat

    class NoFormula(WeightFormat):
        @property
        def label(self) -> str:
            return "mystery-format"

    est = estimate(str(CONFIGS / "gpt2.json"), [NoFormula(), BF16], [], seq_len=1)
    assert [w.label for w in est.weights] == ["bf16"]
    assert any("mystery-format" in x for x in est.architecture.not_interpreted)


def test_estimated_bytes_follow_each_modules_own_format() -> None:
    int4 = WEIGHT_FORMATS["int4"].build(group_size=128)
    mixed = WEIGHT_FORMATS["int4"].build(group_size=128, exclude=["*.o_proj"],
                                         overrides=[{"modules": "*.down_proj", "format": "int8"}])
    est = estimate(str(CONFIGS / "llama-3.1-8b.json"), [BF16, int4, mixed], [], seq_len=1)
    bf16, plain, mix = est.weights
    assert mix.label == "int4-g128-asym-no:o_proj+int8-pc-asym@down_proj"
    layers, hidden, inter = 32, 4096, 14336
    down_int4 = WEIGHT_FORMATS["int4"].build(group_size=128).linear_weight_bytes(hidden, inter, None)
    down_int8 = WEIGHT_FORMATS["int8"].build().linear_weight_bytes(hidden, inter, None)
    o_int4 = int4.linear_weight_bytes(hidden, hidden, None)
    assert mix.bytes - plain.bytes == layers * (down_int8 - down_int4 + 2 * hidden * hidden - o_int4)


@pytest.mark.parametrize("tied", [True, False])
def test_an_override_naming_the_head_is_estimated_as_quantized_exactly(tied: bool) -> None:
    import torch

    from quantlab import quantize_
    from quantlab.engine.memory import weight_bytes
    from quantlab.estimate.worksheet import weight_payload
    from tests.conftest import make_llama

    fmt = WEIGHT_FORMATS["int4"].build(group_size=32, overrides=[{"modules": "lm_head", "format": "int8"}])
    model = make_llama(tie_word_embeddings=tied)
    inventory = from_implementation(model.config)
    assert inventory.head_module == "lm_head" and sum(t.head for t in inventory.tensors) == 1
    estimated = weight_payload(inventory, fmt, torch.float32)
    quantize_(model, fmt)
    assert estimated.bytes == weight_bytes(model)
    plain = weight_payload(inventory, WEIGHT_FORMATS["int4"].build(group_size=32), torch.float32)
    assert estimated.bytes - plain.bytes == model.lm_head.analytic_weight_bytes() - (0 if tied else 4 * 4096 * 128)
