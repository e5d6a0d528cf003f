"""The compiled engine on CPU: each architecture's decode steps over a static cache, compiled with quantlab's
grouped attention, module guards skipped and fused one-row matmuls, give the eager model's logits, for the
native cache and every quantized KV format, without recompiling per position; models compiled in turn keep
their own."""
import types

import pytest
import torch
from torch import nn

from quantlab import quantize_
from quantlab.engine.torch import compiled
from quantlab.engine.torch import decode as latency
from quantlab.extend import KV_FORMATS, WEIGHT_FORMATS
from quantlab.kv.code_attention import plain_store, reads_dense
from quantlab.quant.kernels import half_rows

CPU = torch.device("cpu")
PROMPT, STEPS = 12, 4


def tiny(arch: str) -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    configs = {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**common)),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**common, sliding_window=8)),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**common)),
        "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig(**common, head_dim=16, sliding_window=8,
                                                             layer_types=["sliding_attention", "full_attention"])),
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    }
    cls, config = configs[arch]
    return cls(config).eval()


def decoded_logits(engine: str, model: nn.Module) -> list[torch.Tensor]:
    with latency.DecodeEngine(model, KV_FORMATS["native"].build(), CPU, engine, PROMPT + STEPS) as decode:
        if engine == "compiled":
            assert decode.options["attention"] == "quantlab" and model.config._attn_implementation == "quantlab"
            half = model.lm_head.weight.dtype == torch.bfloat16 if isinstance(model.lm_head, nn.Linear) else False
            kernel = "half_rows" if half_rows.available() else "fused_row_matmul"
            assert decode.options["half_linears"] == (kernel if half else "none in the model")
        logits = logits_of(decode.generation())
        if engine == "compiled":  # one graph: a break anywhere in the step would keep the module guards
            assert decode.options["module_guards"] == "skipped"
        return logits


def logits_of(gen: latency.Generation) -> list[torch.Tensor]:
    model = gen.model
    gen.prefill(torch.arange(PROMPT).unsqueeze(0) * 7 % model.config.vocab_size)
    out = []
    for _ in range(STEPS):
        gen.decode(1)
        out.append(gen.logits.float().clone())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gemma3", "gpt2"])
def test_each_architecture_decodes_the_same_logits_compiled_as_eager(arch: str) -> None:
    model = tiny(arch)
    quantize_(model, WEIGHT_FORMATS["int4"].build(group_size=32))
    before = model.config._attn_implementation
    expected = decoded_logits("eager", model)
    got = decoded_logits("compiled", model)
    assert model.config._attn_implementation == before  # the engine's attention is undone afterwards
    for e, g in zip(expected, got):
        assert torch.allclose(g, e, atol=1e-4, rtol=1e-4), (g - e).abs().max()


KV_CASES = [("int", dict(bits=4, group_size=16, residual_tokens=4)), ("int", dict(bits=8, group_size=16, residual_tokens=0)),
            ("int", dict(bits=2, key_axis="channel", group_size=4, residual_tokens=3)), ("fp8", {}), ("int", dict(bits=3, group_size=8, residual_tokens=2)),
            ("int", dict(bits=4, group_size=16, residual_tokens=20))]


def logits_and_kernel_calls(gen: latency.Generation) -> tuple[list[torch.Tensor], int]:
    """``logits_of`` and the calls of the C attention's ops in the steps after the first (the first compiles: its
    tracing dispatches the ops too). The graph's wrapper calls them, without Python where their kernels are C++, so
    they are counted from the profiler's events."""
    model = gen.model
    gen.prefill(torch.arange(PROMPT).unsqueeze(0) * 7 % model.config.vocab_size)
    out, calls = [], 0
    for step in range(STEPS):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            gen.decode(1)
        if step:
            calls += sum(e.name in ("quantlab::kv_scores", "quantlab::kv_values", "quantlab::kv_scores_ring",
                                    "quantlab::kv_values_ring") for e in prof.events())
        out.append(gen.logits.float().clone())
    return out, calls


def _calls(layer: object) -> int:
    """The C attention's calls of each op a decode step makes for ``layer``."""
    dense = bool(layer.ring_len and reads_dense(layer.keys, layer.values))
    if layer.slots and dense and plain_store(layer.key_store) and plain_store(layer.value_store):
        return 1
    return bool(layer.slots) + dense


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_quantized_kv_format_decodes_compiled_as_the_eager_model_with_that_cache(arch: str) -> None:
    # The eager model runs the dynamic layers (packed.py); the compiled step the static ones (static.py), quantizing
    # each new position inside the graph. Same codes, same logits; one graph for every position (no recompilation:
    # the sliding layers' lengths are tensors). Residual 20 exceeds the 16 positions: nothing stored, all in the ring.
    # A global layer whose stores the C attention reads (kv/code_attention.py) is read by it inside the graph.
    model = tiny(arch)
    for name, fields in KV_CASES:
        kv = KV_FORMATS[name].build(**fields)
        want = logits_of(latency.Generation(model, kv, CPU))
        with torch._dynamo.config.patch(error_on_recompile=True), \
                latency.DecodeEngine(model, kv, CPU, "compiled", PROMPT + STEPS) as decode:
            assert decode.options["attention"] == "quantlab-fused"
            gen = decode.generation()
            got, kernel_calls = logits_and_kernel_calls(gen)
            assert kv.cache_bytes(gen.cache) == kv.cache_bytes_analytic(model.config, 1, PROMPT + STEPS, torch.float32,
                                                                        static=True)
            attending = [layer for layer in gen.cache.layers if getattr(layer, "reads_codes", False)]
            read = [layer for layer in attending if layer.slots]
            # scores and values over the stored codes, and over a ring the kernel reads as floats: one call for
            # both where the stores are plain (not rotated, no static scales), else one each
            parts = sum(_calls(layer) for layer in attending)
            assert kernel_calls == 2 * (STEPS - 1) * parts, (kv.label, kernel_calls)
            assert bool(read) == (fields.get("residual_tokens") != 20), kv.label
        for e, g in zip(want, got):
            assert torch.allclose(g, e, atol=1e-5, rtol=1e-5), (kv.label, (g - e).abs().max())


@pytest.mark.slow
def test_models_compiled_in_turn_each_run_their_own_graph() -> None:
    # Module guards are skipped, so without a step of its own the second model (same class, other weights and
    # other quantized modules) would match the first model's compiled entry and run its graph.
    # The second runs in bfloat16 with int8 layers: its int8 kernel and its bf16 head take the fused one-row matmul.
    first, second = tiny("llama"), tiny("llama")
    with torch.no_grad():
        for p in second.parameters():
            p.mul_(1.5)
    quantize_(second, WEIGHT_FORMATS["int8"].build(compute_dtype="bfloat16"))
    assert second.model.layers[0].mlp.up_proj.kernel_path == "int8pack_mm"
    want_first, want_second = decoded_logits("eager", first), decoded_logits("eager", second)
    got_first, got_second = decoded_logits("compiled", first), decoded_logits("compiled", second)
    for e, g in zip(want_first, got_first):
        assert torch.allclose(g, e, atol=1e-4, rtol=1e-4), (g - e).abs().max()
    for e, g in zip(want_second, got_second):  # bfloat16: agreement to its rounding, the same greedy token
        assert (g - e).abs().max() <= 0.02 * e.abs().max() and g.argmax() == e.argmax()
    assert "forward" not in vars(second.lm_head)  # the fused path is undone with the engine
    assert not torch.allclose(got_first[0], got_second[0], atol=1e-2)


class Breaking(nn.Module):
    """A module whose forward breaks the graph, with a Python constant traced into the code after the break."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.scale = nn.Linear(8, 8), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        torch._dynamo.graph_break()
        return y * self.scale


@pytest.mark.slow
def test_a_step_with_a_graph_break_keeps_its_module_guards() -> None:
    # Unguarded, the second module would run the first one's resumed graph (scale 2 baked in) in place of its own.
    x = torch.randn(1, 8)
    for scale in (2.0, 3.0):
        module, options = Breaking(scale), compiled.compile_options(CPU)
        with compiled.inductor_options(CPU):
            got = compiled.compiled_step(module, CPU, options)(x)
        assert options["module_guards"] == "kept (graph breaks)"
        assert torch.allclose(got, module(x), atol=1e-5), scale


class Scaled(nn.Module):
    """A step that reads a Python attribute of an object passed by keyword (as a cache's layers are read)."""

    def forward(self, x: torch.Tensor, box: object = None) -> torch.Tensor:
        return x * box.scale


@pytest.mark.slow
def test_guards_on_the_engines_own_keyword_arguments_are_skipped_and_the_others_kept() -> None:
    # The attribute is traced in as a constant: guarded, a changed value compiles again; named in own_kwargs (the
    # engine's static cache, built alike for every generation), its guard is gone and the first graph runs on.
    assert compiled._root_kwarg("kwargs['cache'].layers[0].slots") == "cache"
    assert compiled._root_kwarg("G['torch'].float32") is None
    x = torch.ones(1, 4)
    for own, expected in (((), 3.0), (("box",), 2.0)):
        box = types.SimpleNamespace(scale=2.0)
        torch._dynamo.reset()
        with compiled.inductor_options(CPU):
            step = compiled.compiled_step(Scaled(), CPU, compiled.compile_options(CPU), own)
            assert torch.equal(step(x, box=box), 2 * x)
            box.scale = 3.0
            assert torch.equal(step(x, box=box), expected * x), own


BLOCK_KV_CASES = [("nvfp4", dict(residual_tokens=4)), ("mxfp4", {}), ("mxfp8", dict(residual_tokens=4)),
                  ("q4_0", {}), ("q8_0", {}), ("fp8", dict(scales="head"))]


@pytest.mark.slow
def test_block_and_static_scale_kv_formats_decode_compiled_as_eager() -> None:
    # The microscaling, ggml-block and static-scale fp8 stores: the compiled step quantizes each new position inside
    # the graph and the C attention reads the stored codes (a static per-head fp8 scale applied after it).
    from tests.kv.test_static import tiny as tiny_heads

    model = tiny_heads("llama", head_dim=64)  # heads of 64: every block size divides them
    for name, fields in BLOCK_KV_CASES:
        kv = KV_FORMATS[name].build(**fields)
        if kv.calibrates:
            kv = kv.calibrated(model, [torch.arange(1, 41).unsqueeze(0) * 3 % 128])
        want = logits_of(latency.Generation(model, kv, CPU))
        with torch._dynamo.config.patch(error_on_recompile=True), \
                latency.DecodeEngine(model, kv, CPU, "compiled", PROMPT + STEPS) as decode:
            got = logits_of(decode.generation())
        for e, g in zip(want, got):
            assert torch.allclose(g, e, atol=1e-5, rtol=1e-5), (kv.label, (g - e).abs().max())
