"""How to serve a plan: the commands that measure it whole, export its weights, and run it in llama.cpp and vLLM,
with the cache each engine can hold. llama.cpp holds one key type and one value type in every layer
(``-ctk``/``-ctv``); vLLM holds
fp8 in every layer but those it skips (``--kv-cache-dtype-skip-layers``, kept in the model's dtype). Each KV format
says which type an engine would hold it in and whether that type stores what it stores (``serving_caches``);
where the engine cannot hold the plan's cache, the command shows the nearest it can and the plan says how it
differs."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..kv.format import KVFormat

SERVING_TARGETS = ("gguf", "compressed-tensors")  # the export targets llama.cpp and vLLM load

# llama.cpp's cache types from the fewest bytes per element to the most
LLAMA_CPP_ORDER = ("q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "q8_0", "bf16", "f16", "f32")


def layer_formats(kv: KVFormat, layers: int) -> list[KVFormat]:
    """The format each decoder layer's cache is in (a per-layer format's own choice, else the one format)."""
    of = getattr(kv, "format_of", None)
    return [of(i) if of else kv for i in range(layers)]


def _one_type(side: str, types: list[tuple[str, bool] | None], labels: list[str]) -> tuple[str, str | None]:
    """llama.cpp's type for one side (keys or values) of every layer, and how it differs from the plan (None: as
    planned)."""
    missing = sorted({label for label, t in zip(labels, types) if t is None})
    if missing:
        return "f16", f"{side}: llama.cpp has no cache type for {', '.join(missing)}, f16 shown"
    count = Counter(t[0] for t in types if t is not None)
    if len(count) == 1:
        inexact = sorted({label for label, t in zip(labels, types) if t is not None and not t[1]})
        return next(iter(count)), (None if not inexact else f"{side}: the nearest llama.cpp type to "
                                   f"{', '.join(inexact)} (same bits, its own blocks and scales)")
    smallest = min(count, key=lambda n: LLAMA_CPP_ORDER.index(n) if n in LLAMA_CPP_ORDER else len(LLAMA_CPP_ORDER))
    kept = ", ".join(f"{n} in {c}" for n, c in count.most_common())
    return smallest, (f"{side}: llama.cpp holds one type in every layer, the plan's smallest, {smallest}, for all "
                      f"{len(types)} layers (the plan: {kept}), so more divergence and less memory than planned")


def llama_server_cache(formats: list[KVFormat]) -> tuple[str, str, str]:
    """llama.cpp's key and value cache types for the plan (``-ctk``, ``-ctv``), and how they differ from it."""
    sides = [f.serving_cache_sides().get("llama.cpp") for f in formats]
    labels = [f.label for f in formats]
    ctk, k_note = _one_type("keys", [s[0] if s else None for s in sides], labels)
    ctv, v_note = _one_type("values", [s[1] if s else None for s in sides], labels)
    notes = [n for n in (k_note, v_note) if n]
    return ctk, ctv, "; ".join(notes) if notes else "the plan's cache"


def vllm_cache(formats: list[KVFormat]) -> tuple[str, list[int], str]:
    """vLLM's ``--kv-cache-dtype``, the layers it skips (kept in the model's dtype), and how it differs."""
    types = [f.serving_caches().get("vllm") for f in formats]
    missing = sorted({f.label for f, t in zip(formats, types) if t is None})
    if missing:
        return "auto", [], f"vLLM has no cache type for {', '.join(missing)}: the model's dtype shown"
    skip = [i for i, t in enumerate(types) if t is not None and t[0] == "auto"]
    if len(skip) == len(formats):
        return "auto", [], "the plan's cache (the model's dtype)"
    inexact = sorted({f.label for f, t in zip(formats, types) if t is not None and t[0] != "auto" and not t[1]})
    note = "the plan's cache" if not inexact else f"fp8, vLLM's nearest to {', '.join(inexact)}"
    return "fp8", skip, note


def serve_lines(variant: str, kv: KVFormat, layers: int, context_tokens: int, batch_size: int,
                refusals: dict[str, str | None]) -> list[str]:
    """plan.md's section on measuring, exporting and serving the plan (``variant``: its label in plan-recipe.yaml;
    ``refusals``: per export target, why the plan's weights cannot be written there, or None: plan-recipe.yaml
    exports them)."""
    from ..files import export_folder

    formats = layer_formats(kv, layers)
    ctk, ctv, llama_note = llama_server_cache(formats)
    dtype, skip, vllm_note = vllm_cache(formats)
    run = Path("runs/plan")
    gguf, ct = (export_folder(run, variant, to) for to in SERVING_TARGETS)
    fa = " -fa on" if ctv not in ("f16", "bf16", "f32") else ""  # a quantized V cache needs flash attention
    vllm = (f"vllm serve {ct} --max-model-len {context_tokens} --max-num-seqs {batch_size}"
            + (f" --kv-cache-dtype {dtype}" if dtype != "auto" else "")
            + (f" --kv-cache-dtype-skip-layers {' '.join(map(str, skip))}" if dtype != "auto" and skip else ""))
    commands = [f"quantlab run plan-recipe.yaml --out {run}"]
    if refusals.get("gguf") is None:
        commands.append(f"llama-server -m {gguf / 'model.gguf'} -c {context_tokens * batch_size} -np {batch_size}"
                        f"{fa} -ctk {ctk} -ctv {ctv}")
    if refusals.get("compressed-tensors") is None:
        commands.append(vllm)
    written = [to for to, why in refusals.items() if why is None]
    return [
        "## Serving it", "",
        "Measure the plan whole (its KL beside the prediction, every uniform configuration beside it); the same run "
        + (f"writes the measured weights as {' and '.join(written)} under {run / 'exports'}" if written else
           "cannot export them") + ", then serve them:", "",
        "```", *commands, "```", "",
        f"- llama.cpp's cache: {llama_note}.",
        f"- vLLM's cache: {vllm_note}.",
        *(f"- Not exported to {to}: {why}." for to, why in refusals.items() if why is not None),
    ]
