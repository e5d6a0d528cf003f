import pytest
import torch

from conftest import make_llama
from quantlab.engine.device import timed_ms
from quantlab.engine.torch.decode import measure_decode
from quantlab.extend import KV_FORMATS

CPU = torch.device("cpu")


STATIC_CODES = "static: global layers' decode rows read the stored codes"


@pytest.mark.parametrize("kv,options", [
    (KV_FORMATS["native"].build(), {"cache": "DynamicCache", "compiled": False, "attention": "quantlab"}),
    (KV_FORMATS["int4"].build(group_size=32, residual_tokens=8),
     {"cache": "Cache", "compiled": False, "attention": "quantlab-fused", "kv_layers": STATIC_CODES})])
def test_decode_record_names_the_cache_it_used_and_keeps_every_step(kv, options: dict) -> None:
    model = make_llama()
    result = measure_decode(model, kv, batch_size=2, prompt_tokens=16, new_tokens=6, warmup_runs=1,
                            prefill_repeats=2, seed=0, device=CPU, engine="eager")
    record = result.record(2)
    assert record["engine"] == "eager" and record["engine_options"] == options
    assert len(record["decode_ms_samples"]) == record["decode_steps"] == 6
    assert record["decode_ms_p10"] <= record["decode_ms_per_token"] <= record["decode_ms_p90"]
    assert record["tokens_per_s"] == pytest.approx(2 * 1000 / record["decode_ms_per_token"], rel=1e-3)
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"] and record["kv_cache_tokens"] == 22


def test_the_eager_engine_reads_a_quantized_cache_from_its_codes_without_rebuilding_the_history(monkeypatch) -> None:
    # A decode row of a global layer goes through the C attention over the stored codes (and over the ring's
    # 16-bit rows, by the same kernel's casts); no store is dequantized
    # (CodeStore.read) after the prefill, and the logits are those of the dynamic layers' dequantized history.
    from quantlab.engine.torch.decode import DecodeEngine, Generation
    from quantlab.kv import code_attention
    from quantlab.kv.static import CodeStore

    model, kv = make_llama(), KV_FORMATS["int4"].build(group_size=32, residual_tokens=4)
    ids = torch.arange(1, 17).unsqueeze(0) * 7 % model.config.vocab_size
    want = Generation(model, kv, CPU)  # dynamic layers, model attention
    want.prefill(ids)
    want_logits = [want.logits.clone()]
    for _ in range(6):
        want.decode(1)
        want_logits.append(want.logits.clone())
    reads, kernel = [], []
    read, scores, values = CodeStore.read, code_attention.scores_op, code_attention.values_op
    monkeypatch.setattr(CodeStore, "read", lambda self, dtype: reads.append(1) or read(self, dtype))
    monkeypatch.setattr(code_attention, "scores_op", lambda *a: kernel.append("scores") or scores(*a))
    monkeypatch.setattr(code_attention, "values_op", lambda *a: kernel.append("values") or values(*a))
    ring_scores, ring_values = code_attention.ring_scores_op, code_attention.ring_values_op
    monkeypatch.setattr(code_attention, "ring_scores_op", lambda *a: kernel.append("ring scores") or ring_scores(*a))
    monkeypatch.setattr(code_attention, "ring_values_op", lambda *a: kernel.append("ring values") or ring_values(*a))
    with DecodeEngine(model, kv, CPU, "eager", 16 + 6) as decode:
        gen = decode.generation()
        gen.prefill(ids)
        got_logits = [gen.logits.clone()]
        reads.clear()
        for _ in range(6):
            gen.decode(1)
            got_logits.append(gen.logits.clone())
    layers = model.config.num_hidden_layers
    # one call for the scores and one for the values per layer and step, the stored codes and the ring's recent
    # rows together
    assert reads == [] and kernel == ["ring scores", "ring values"] * 6 * layers
    for step, (w, g) in enumerate(zip(want_logits, got_logits)):
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-5), (step, (g - w).abs().max())


@pytest.mark.gpu
def test_cuda_events_time_the_work_on_the_stream_not_the_launch() -> None:
    dev = torch.device("cuda")
    # 50M cycles: over 15 ms at any clock below 3 GHz, while the launch itself returns in microseconds.
    _, ms = timed_ms(lambda: torch.cuda._sleep(50_000_000), dev)
    assert ms > 10


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["eager", "compiled"])
def test_cuda_decode_records_allocator_peaks_and_the_engine(engine: str) -> None:
    dev = torch.device("cuda")
    model = make_llama().to(dev, torch.bfloat16)
    result = measure_decode(model, KV_FORMATS["native"].build(), batch_size=1, prompt_tokens=16, new_tokens=8,
                            warmup_runs=1, prefill_repeats=2, seed=0, device=dev, engine=engine)
    record = result.record(1)
    assert record["decode_steps"] == 8 and record["prefill_ms"] > 0
    assert record["peak_reserved_bytes"] >= record["peak_memory_bytes"] > 0
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"]
    if engine == "compiled":
        assert record["engine_options"]["mode"] == "reduce-overhead"
        assert record["engine_options"]["inductor"]["coordinate_descent_tuning"] is True


def _tiny_gemma3() -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                 layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128)
    return tf.Gemma3ForCausalLM(config).eval()


def test_auto_measures_eagerly_where_the_kv_format_has_no_static_cache_and_says_why() -> None:
    pytest.importorskip("optimum.quanto")
    theirs = KV_FORMATS["hf-quantized"].build(backend="quanto", bits=4, group_size=16, residual_tokens=4)
    result = measure_decode(make_llama(), theirs, batch_size=1, prompt_tokens=12, new_tokens=3, warmup_runs=0,
                            prefill_repeats=1, seed=0, device=CPU, engine="auto")
    record = result.record(1)
    assert record["engine"] == "eager" and record["decode_steps"] == 3
    assert record["engine_options"]["engine_choice"] == (
        "auto: eager, KV format hf-quanto-int4-g16-r4 has no static cache; use engine eager")


@pytest.mark.slow
def test_auto_compiles_a_sliding_window_model_with_per_channel_keys() -> None:
    kivi = KV_FORMATS["int2"].build(key_axis="channel", group_size=4, residual_tokens=3)
    record = measure_decode(_tiny_gemma3(), kivi, batch_size=1, prompt_tokens=12, new_tokens=3, warmup_runs=0,
                            prefill_repeats=1, seed=0, device=CPU, engine="auto").record(1)
    assert record["engine"] == "compiled" and record["engine_options"]["engine_choice"] == "auto: compiled"
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"]  # the static layout's formula


def test_auto_falls_back_to_eager_when_the_step_does_not_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantlab.engine.torch import decode

    def refusing(*args, **kwargs):
        def step(*a, **k):
            raise torch._dynamo.exc.TorchRuntimeError("an operator the compiler refuses")
        return step

    monkeypatch.setattr(decode, "compiled_step", refusing)
    record = measure_decode(make_llama(), KV_FORMATS["native"].build(), batch_size=1, prompt_tokens=8, new_tokens=3,
                            warmup_runs=0, prefill_repeats=1, seed=0, device=CPU, engine="auto").record(1)
    assert record["engine"] == "eager" and record["decode_steps"] == 3
    assert record["engine_options"]["engine_choice"] == (
        "auto: eager, the step did not compile (TorchRuntimeError: an operator the compiler refuses)")


def test_a_generation_longer_than_its_static_cache_is_refused_before_it_runs() -> None:
    """A compiled step would index past its cache buffers; the generation says so instead."""
    from quantlab.engine.torch.decode import Generation

    model = make_llama()
    gen = Generation(model, KV_FORMATS["native"].build(), CPU, max_cache_len=12)
    gen.prefill(torch.zeros(1, 8, dtype=torch.long))
    assert len(gen.decode(4)) == 4
    with pytest.raises(ValueError, match="12 positions \\+ 1 steps exceed the static cache's 12"):
        gen.decode(1)


def test_the_prefill_computes_the_head_for_the_last_position_only_and_takes_its_argmax() -> None:
    """As generate() and llama.cpp do: the other positions' logits are never used, and for a large vocabulary the
    head over every prompt position costs more than the rest of the prefill."""
    from quantlab.engine.torch.decode import Generation

    model = make_llama()
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    gen = Generation(model, KV_FORMATS["native"].build(), CPU)
    gen.prefill(ids)
    logits, token = gen.logits.clone(), gen.token.item()
    gen.decode(2)
    assert rows == [1, 1, 1]
    with torch.inference_mode():
        full = model(input_ids=ids).logits[:, -1]
    assert torch.allclose(logits.float(), full.float(), atol=1e-5, rtol=1e-4)
    assert token == full.argmax(-1).item()


def test_a_model_whose_token_embedding_is_held_in_ggml_blocks_is_measured() -> None:
    """A named GGUF mix of a tied model looks its tokens up in the head's blocks (a module with no ``weight``):
    decoding reads the cache's dtype from the lookup's output."""
    from quantlab import quantize_
    from quantlab.quant.embedding import BlockEmbedding
    from quantlab.quant.format import build_format

    model = make_llama(hidden_size=256)
    quantize_(model, build_format({"format": "gguf", "recipe": "Q4_K_M"}))
    assert isinstance(model.get_input_embeddings(), BlockEmbedding)
    native = KV_FORMATS["native"].build()
    record = measure_decode(model, native, batch_size=1, prompt_tokens=8, new_tokens=3, warmup_runs=0,
                            prefill_repeats=1, seed=0, device=torch.device("cpu"), engine="eager").record(1)
    assert record["decode_steps"] == 3
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_analytic"] == \
        native.cache_bytes_analytic(model.config, 1, 11, torch.float32)


def test_rounds_make_the_model_ready_once_and_warm_up_before_each_later_round(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantlab.engine.torch import decode

    def refusing(*args, **kwargs):  # auto's choice, made once, is said by every round
        def step(*a, **k):
            raise torch._dynamo.exc.TorchRuntimeError("an operator the compiler refuses")
        return step

    monkeypatch.setattr(decode, "compiled_step", refusing)
    warm_ups, entered = [], []
    warm_up = decode.DecodeEngine.warm_up
    monkeypatch.setattr(decode.DecodeEngine, "warm_up",
                        lambda self, ids, steps: (warm_ups.append((self.name, steps)), warm_up(self, ids, steps)))
    enter = decode.DecodeEngine.__enter__
    monkeypatch.setattr(decode.DecodeEngine, "__enter__", lambda self: (entered.append(self.name), enter(self))[1])
    with decode.decode_rounds(make_llama(), KV_FORMATS["native"].build(), batch_size=1, prompt_tokens=8,
                              new_tokens=12, warmup_runs=2, prefill_repeats=1, seed=0, device=CPU,
                              engine="auto") as timed:
        assert entered == ["compiled", "eager"] and warm_ups == [("compiled", 8)] + [("eager", 8)] * 2
        records = [timed().record(1) for _ in range(3)]
    assert entered == ["compiled", "eager"]  # made ready once for every round
    # warmup_runs before the first round, one short one before each later
    assert warm_ups == [("compiled", 8)] + [("eager", 8)] * 4
    for record in records:
        assert record["decode_steps"] == 12 and record["engine"] == "eager"
        assert record["engine_options"]["engine_choice"].startswith("auto: eager, the step did not compile")


def test_the_prefill_hands_the_output_head_its_last_position_with_canonical_strides() -> None:
    """transformers slices the prompt's last position for the head as a view with the prompt's strides; torch's
    matmul multiplies such a bf16 view as a batch, copying the whole head first. While an engine is open the head's
    input is re-viewed with its own strides (same values); after it, the model is as it was."""
    from quantlab.engine.torch.decode import DecodeEngine

    model = make_llama().to(torch.bfloat16)
    head = model.get_output_embeddings()
    seen: list[tuple[int, ...]] = []
    ids = torch.arange(1, 25).unsqueeze(0)
    spy = None
    try:
        with DecodeEngine(model, KV_FORMATS["native"].build(), CPU, "eager") as engine:
            spy = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].stride()))  # runs after
            gen = engine.generation()
            gen.prefill(ids)
            logits = gen.logits.clone()
        assert seen[-1] == (128, 128, 1)  # [1, 1, hidden], not the prompt's (24 * 128, 128, 1)
        seen.clear()
        plain = model(input_ids=ids, logits_to_keep=1).logits[:, -1]
        assert seen[-1] == (24 * 128, 128, 1)  # the engine's hook is gone
        assert (logits.float() - plain.float()).norm() / plain.float().norm() < 1e-2  # bf16 products' order
    finally:
        if spy is not None:
            spy.remove()
