import pytest
import torch

from quantlab.kv import KV_FORMATS
from quantlab.kv.hf_compat import cache_kwarg
from tests.conftest import make_llama

FORMATS = [("fp32", {}), ("bf16", {}), ("fp16", {}), ("fp8", {}), ("int8", {}), ("int4", {"group_size": 32}),
           ("int2", {"group_size": 32, "residual_tokens": 16}),
           ("int2", {"key_axis": "channel", "group_size": 32, "residual_tokens": 16})]


def _run(model, kv, ids: torch.Tensor, prompt: int):
    cache = kv.make_cache(model.config)
    arg = cache_kwarg(model)
    with torch.no_grad():
        logits = [model(input_ids=ids[:, :prompt], use_cache=True, **{arg: cache}).logits[:, -1]]
        for i in range(prompt, ids.shape[1]):
            logits.append(model(input_ids=ids[:, i: i + 1], use_cache=True, **{arg: cache}).logits[:, -1])
    return cache, torch.stack(logits, 1)


@pytest.mark.parametrize("name,params", FORMATS)
@pytest.mark.parametrize("batch,prompt,total", [(1, 20, 40), (2, 100, 150), (3, 7, 9)])
def test_measured_bytes_match_the_formula_exactly(name: str, params: dict, batch: int, prompt: int, total: int) -> None:
    model = make_llama()
    kv = KV_FORMATS[name].build(**params)
    ids = torch.randint(0, 4096, (batch, total), generator=torch.Generator().manual_seed(0))
    cache, _ = _run(model, kv, ids, prompt)
    assert cache.get_seq_length() == total
    assert kv.cache_bytes(cache) == kv.cache_bytes_analytic(model.config, batch, total, torch.float32)


def test_fewer_bits_store_fewer_bytes_and_err_more() -> None:
    model = make_llama()
    ids = torch.randint(0, 4096, (1, 300), generator=torch.Generator().manual_seed(1))
    _, ref = _run(model, KV_FORMATS["fp32"].build(), ids, 200)
    sizes, errors = {}, {}
    for bits in (8, 4, 2):
        kv = KV_FORMATS[f"int{bits}"].build(group_size=32, residual_tokens=0)
        cache, logits = _run(model, kv, ids, 200)
        sizes[bits], errors[bits] = kv.cache_bytes(cache), (logits - ref).norm().item() / ref.norm().item()
    assert sizes[8] > sizes[4] > sizes[2]
    assert sizes[4] < 0.3 * 300 * 2 * 2 * 2 * 32 * 4  # vs fp32: layers x K/V x heads x head_dim x 4 bytes
    assert errors[8] < errors[4] < errors[2]


def test_cast_formats_store_their_dtype() -> None:
    model = make_llama()
    ids = torch.randint(0, 4096, (1, 64))
    sizes = {}
    for name in ("fp32", "bf16", "fp8"):
        kv = KV_FORMATS[name].build()
        sizes[name] = kv.cache_bytes(_run(model, kv, ids, 32)[0])
    assert sizes["fp32"] == 2 * sizes["bf16"]
    assert sizes["fp8"] == sizes["bf16"] // 2 + 2 * 2 * 64 * 2 * 2  # + an fp16 scale per position, head, K/V, layer


@pytest.mark.parametrize("name,params", [("int4", {"group_size": 32}), ("fp8", {}), ("int2", {"key_axis": "channel", "group_size": 32})])
def test_generate_runs_with_a_quantized_cache(name: str, params: dict) -> None:
    from quantlab.models import load_model
    from quantlab.run.recipe import ModelSpec

    loaded = load_model(ModelSpec(bundled="tiny-stdlib-llama"))
    kv = KV_FORMATS[name].build(**params)
    ids = loaded.tokenizer("def read_file(path):\n    ", return_tensors="pt")["input_ids"]
    cache = kv.make_cache(loaded.model.config)
    out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, **{cache_kwarg(loaded.model): cache})
    assert out.shape[1] == ids.shape[1] + 12
    assert cache.get_seq_length() >= ids.shape[1] + 11


def test_a_group_size_that_does_not_divide_the_head_dim_is_refused_before_running(tmp_path, small_model_dir) -> None:
    from quantlab import QuantlabError, run_recipe, validate_recipe

    recipe = validate_recipe({"name": "kv", "model": {"path": str(small_model_dir)}, "weights": ["fp32"],
                              "kv_cache": [{"format": "int4", "group_size": 8}, {"format": "int4", "group_size": 64}]})
    with pytest.raises(QuantlabError, match=r"kv_cache\[1\]: int4-g64-r128: group_size 64 does not divide the head dimension 32"):
        run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()


def _tiny(arch: str):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=256, max_position_embeddings=256)
    if arch == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=512, n_embd=128, n_layer=2, n_head=4,
                                                                    n_positions=256)).eval()
    config = {"mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config}[arch](**common)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gpt2"])
def test_other_architectures_generate_with_exact_bytes(arch: str) -> None:
    model = _tiny(arch)
    kv = KV_FORMATS["int4"].build(group_size=32, residual_tokens=8)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    cache, logits = _run(model, kv, ids, 16)
    _, ref = _run(model, KV_FORMATS["fp32"].build(), ids, 16)
    assert kv.cache_bytes(cache) == kv.cache_bytes_analytic(model.config, 2, 24, torch.float32)
    assert (logits - ref).norm() / ref.norm() < 0.2
    out = model.generate(ids[:, :16], max_new_tokens=6, do_sample=False,
                         **{cache_kwarg(model): kv.make_cache(model.config)})
    assert out.shape == (2, 22)


def _gemma3():
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                           num_attention_heads=4, num_key_value_heads=1, head_dim=64, sliding_window=16,
                                           max_position_embeddings=256,
                                           layer_types=["sliding_attention"] * 3 + ["full_attention"])
    return transformers.Gemma3ForCausalLM(config).eval()


@pytest.mark.parametrize("name,params", [("bf16", {}), ("int8", {"residual_tokens": 4}), ("int4", {"group_size": 32, "residual_tokens": 0}),
                                         ("int2", {"key_axis": "channel", "group_size": 8, "residual_tokens": 4})])
@pytest.mark.parametrize("prompt,total", [(10, 14), (30, 50), (5, 40)])
def test_sliding_window_layers_keep_only_their_window(name: str, params: dict, prompt: int, total: int) -> None:
    model = _gemma3()
    kv = KV_FORMATS[name].build(**params)
    ids = torch.randint(0, 512, (1, total), generator=torch.Generator().manual_seed(0))
    cache, logits = _run(model, kv, ids, prompt)
    assert kv.cache_bytes(cache) == kv.cache_bytes_analytic(model.config, 1, total, torch.float32)
    full_kv = KV_FORMATS["native"].build()
    _, ref = _run(model, full_kv, ids, prompt)
    assert (logits - ref).norm() / ref.norm() < (0.05 if name in ("bf16", "int8") else 0.5)
    if total > 16:  # the three sliding layers hold 15 positions, the global one all of them
        per_position = kv.cache_bytes_analytic(model.config, 1, total, torch.float32)
        assert per_position < kv.cache_bytes_analytic(model.config.__class__(**{**model.config.to_dict(),
                                                      "layer_types": ["full_attention"] * 4}), 1, total, torch.float32)


def test_gemma3_generates_with_a_packed_cache() -> None:
    model = _gemma3()
    kv = KV_FORMATS["int4"].build(group_size=32, residual_tokens=4)
    ids = torch.randint(0, 512, (1, 20))
    out = model.generate(ids, max_new_tokens=8, do_sample=False, **{cache_kwarg(model): kv.make_cache(model.config)})
    assert out.shape == (1, 28)


def test_transformers_quantized_cache_is_a_selectable_format() -> None:
    pytest.importorskip("optimum.quanto")
    model = make_llama()
    ids = torch.randint(0, 4096, (1, 200), generator=torch.Generator().manual_seed(0))
    theirs = KV_FORMATS["hf-quantized"].build(backend="quanto", bits=4, group_size=32, residual_tokens=16)
    ours = KV_FORMATS["int4"].build(group_size=32, residual_tokens=16)
    _, ref = _run(model, KV_FORMATS["fp32"].build(), ids, 150)
    sizes = {}
    for kv in (theirs, ours):
        cache, logits = _run(model, kv, ids, 150)
        sizes[kv.label] = kv.cache_bytes(cache)
        assert (logits - ref).norm() / ref.norm() < 0.3
    full = 2 * 2 * 2 * 200 * 32 * 4  # layers x K/V x heads x positions x head dim x fp32
    assert sizes[theirs.label] < 0.5 * full and sizes[ours.label] < 0.5 * full
    assert theirs.cache_bytes_analytic(model.config, 1, 200, torch.float32) is None
