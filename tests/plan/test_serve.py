"""How a plan is served: the cache type llama.cpp (one type in every layer) and vLLM (fp8 but for skipped layers)
hold for a plan's per-layer cache, and what each says where it differs from the plan."""
from quantlab.extend import KV_FORMATS
from quantlab.kv.per_layer import build_kv_format
from quantlab.plan.serve import LLAMA_CPP_ORDER, layer_formats, llama_server_cache, serve_lines, vllm_cache

NATIVE = KV_FORMATS["native"].build()
Q8 = KV_FORMATS["q8_0"].build(rotate="hadamard")
INT4 = KV_FORMATS["int4"].build(group_size=32, residual_tokens=0)
FP8_HEAD = KV_FORMATS["fp8"].build(scales="head")


def test_every_kv_format_names_engine_types_that_exist() -> None:
    for name in KV_FORMATS.names():
        cls = KV_FORMATS[name]
        fields = getattr(cls, "example_fields", None)
        if fields is None or name == "per-layer":
            continue
        caches = KV_FORMATS[name].build(**fields).serving_caches()
        assert set(caches) <= {"llama.cpp", "vllm"}, name
        assert caches.get("llama.cpp", ("f16",))[0] in LLAMA_CPP_ORDER, name
        assert caches.get("vllm", ("auto",))[0] in ("auto", "fp8"), name


def test_a_uniform_cache_is_served_as_it_is_where_the_engine_has_its_type() -> None:
    assert llama_server_cache([Q8] * 4) == ("q8_0", "q8_0", "the plan's cache")  # llama.cpp rotates q8_0 as this does
    assert vllm_cache([FP8_HEAD] * 4) == ("fp8", [], "the plan's cache")
    assert vllm_cache([NATIVE] * 4)[:2] == ("auto", [])
    ctk, ctv, note = llama_server_cache([INT4] * 4)
    assert ctk == ctv == "q4_0" and "nearest" in note and INT4.label in note
    split = build_kv_format({"format": "split", "keys": {"format": "q8_0", "rotate": "hadamard"},
                             "values": {"format": "q4_0", "rotate": "hadamard"}})
    assert llama_server_cache([split] * 4) == ("q8_0", "q4_0", "the plan's cache")  # -ctk q8_0 -ctv q4_0


def test_a_per_layer_cache_takes_the_smallest_type_in_llama_cpp_and_skips_layers_in_vllm() -> None:
    kv = build_kv_format({"format": "per-layer", "default": "native",
                          "layers": [{"layers": [1, 2], "format": "q8_0", "rotate": "hadamard"},
                                     {"layers": [3], "format": "int4", "group_size": 32, "residual_tokens": 0}]})
    formats = layer_formats(kv, 5)
    assert [f.label for f in formats] == ["native", Q8.label, Q8.label, INT4.label, "native"]
    ctk, ctv, note = llama_server_cache(formats)
    assert ctk == ctv == "q4_0" and "for all 5 layers" in note and "f16 in 2" in note
    dtype, skip, _ = vllm_cache(formats)
    assert dtype == "fp8" and skip == [0, 4]
    lines = "\n".join(serve_lines("w/kv-x", kv, 5, 8192, 8, {"gguf": None, "compressed-tensors": None}))
    assert "vllm serve runs/plan/exports/w_kv-x/compressed-tensors --max-model-len 8192 --max-num-seqs 8 " \
           "--kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 0 4" in lines
    assert "llama-server -m runs/plan/exports/w_kv-x/gguf/model.gguf -c 65536 -np 8 -fa on -ctk q4_0 -ctv q4_0" \
        in lines
    assert "writes the measured weights as gguf and compressed-tensors under runs/plan/exports" in lines
    refused = "\n".join(serve_lines("w/kv-x", kv, 5, 8192, 8, {"gguf": "no Q8 asymmetric groups",
                                                                "compressed-tensors": None}))
    assert "llama-server" not in refused and "- Not exported to gguf: no Q8 asymmetric groups." in refused
