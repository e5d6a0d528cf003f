"""``engine: llama.cpp``: a variant measured by llama.cpp itself, from the GGUF file quantlab exports of it.

The variant's weights are quantized by quantlab as for any engine, exported to GGUF (``quant/io/gguf.py``: ggml
blocks byte for byte), and the file is loaded by llama.cpp in a process of its own (``llama_cpp.LlamaCppProcess``).
Then:

- decode latency: llama.cpp's greedy generation of the same random prompt quantlab's engines time, after the
  same warm-up; prefill the median of the recipe's repeats, each decode step timed alone in the child;
- memory: weights are the file's tensor bytes (what a llama.cpp step reads, a tied embedding read whole as the
  output matrix), the KV cache llama.cpp's cache type × the positions held (formula), the peak the child's
  resident set (``VmHWM``) during the timed prefill and decode;
- perplexity and divergence: ``LlamaCppLM`` stands for the model in quantlab's evaluations: each window is
  evaluated by llama.cpp from an empty context and its logits (every position, float32) come back, so the same
  windows are scored by the same code as quantlab's rows, against the same stored baseline distributions.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ...errors import UnsupportedError
from ..base import DecodeResult, Figure, prompt_ids
from ..machine_load import watch_machine
from . import NAME
from .process import FLOAT_CACHE_TYPES, LlamaCppProcess, gguf_weight_components, kv_cache_bytes, uses_flash_attention


def attention_rotation(cache_type: str, rotate: bool = True) -> str:
    """What llama.cpp does to keys and values before it stores them in ``cache_type``, as its rows record it."""
    if cache_type in FLOAT_CACHE_TYPES:
        return "none (a float cache; llama.cpp rotates only quantized K/V caches)"
    if not rotate:
        return "none (LLAMA_ATTN_ROT_DISABLE=1 in its process: the KV format is not rotated)"
    return ("Walsh-Hadamard on keys and values of heads whose size is a multiple of 64 (llama.cpp's default for "
            "quantized caches; keys in blocks of the largest power of two dividing the head, values of 64)")


def serve(ctx: Any, cache_type: str | None, rotate: bool = True) -> "LlamaCppVariant":
    """Export the variant's measured model to GGUF (the run folder's ``exports/<label>/gguf``, else a temporary
    folder) and load the file in llama.cpp, with the KV format's cache type and room for the longest point."""
    from ...files import export_folder
    from ...models import model_source
    from ...progress import stage
    from ...quant.io import export_
    from ...quant.io.gguf import GGUF_FILE

    if cache_type is None:
        raise UnsupportedError(f"engine {NAME}: KV format {ctx.variant.kv.label} has no llama.cpp cache type (native, "
                               "fp16, bf16 and fp32 do)")
    folder = (export_folder(ctx.run_folder, ctx.variant.label, "gguf") if ctx.run_folder is not None
              else Path(tempfile.mkdtemp(prefix="quantlab-llama-cpp-")))
    with stage("exporting the variant to GGUF for llama.cpp"):
        export_(ctx.model, "gguf", folder, tokenizer=ctx.tokenizer, source=model_source(ctx.recipe.model))
    w = ctx.recipe.workload
    n_ctx = max(p for _, p in w.points()) + w.new_tokens
    with stage("starting llama.cpp on the exported file"):
        return LlamaCppVariant(folder / GGUF_FILE, cache_type, torch.get_num_threads(), n_ctx, rotate)


def note(rows: list[dict[str, Any]], figure: Figure) -> str:
    """The sentence on the rows llama.cpp measured, for ``figure``'s provenance."""
    served = [r for r in rows if r.get("engine") == NAME and r.get("status") == "ok"]
    if not served:
        return ""
    names = ", ".join(r["variant"] for r in served)
    if figure == "weights":
        return (f" Rows measured by llama.cpp ({names}): the tensor bytes of the GGUF file it ran, every one read by "
                "a decode step (a tied embedding is read whole as the output matrix).")
    options = served[0].get("engine_options") or {}
    return (f" Rows on engine llama.cpp ({names}): the variant's GGUF export "
            f"(exports/<variant>/gguf) run by llama.cpp (llama-cpp-python {options.get('llama_cpp_python', '—')}, "
            f"{options.get('threads', '—')} threads, KV cache {options.get('cache_type', '—')}, attention rotation "
            f"{options.get('attention_rotation', 'not recorded')}) in a process of its own, the same prompt and "
            "warm-up, each step timed alone there; their perplexity and divergence are llama.cpp's logits on the same "
            "windows, against the same baseline; their KV bytes are the cache type's formula and their peak that "
            "process's resident peak.")


def ask_for_arrays(process: LlamaCppProcess, name: str, **cmd: Any) -> dict[str, torch.Tensor]:
    """Ask the child for arrays it writes to a file (``name``: ``.npy`` for one, ``.npz`` for several), read back
    as tensors (``logits`` for a single array)."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="quantlab-llama-cpp-") as folder:
        path = str(Path(folder) / name)
        process.ask(path=path, **cmd)
        if name.endswith(".npy"):
            return {"logits": torch.from_numpy(np.load(path))}
        with np.load(path) as found:
            return {k: torch.from_numpy(found[k]) for k in found.files}


class LlamaCppLM(nn.Module):
    """llama.cpp's logits for whole windows, called as quantlab's evaluations call a model
    (``model(input_ids=[batch, window]).logits`` → ``[batch, window, vocab]`` float32), each window from an empty
    context. A cache (``past_key_values``) is refused: llama.cpp's scoring here holds no transformers cache."""

    def __init__(self, process: LlamaCppProcess) -> None:
        super().__init__()
        self.process = process

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, **_: Any) -> SimpleNamespace:
        if past_key_values is not None:
            raise UnsupportedError(f"engine {NAME} scores whole windows (perplexity protocols windows and sliding), "
                                   "not through a transformers cache")
        found = ask_for_arrays(self.process, "logits.npy", cmd="logits", windows=input_ids.tolist(),
                                window=input_ids.shape[1], all_positions=True)
        return SimpleNamespace(logits=found["logits"].to(input_ids.device))


class LlamaCppVariant:
    """One variant's GGUF file held by llama.cpp for its measurements (``close`` ends the child)."""

    def __init__(self, gguf_path: Path, cache_type: str, threads: int, n_ctx: int, rotate: bool = True) -> None:
        self.path, self.threads = gguf_path, threads
        self.cache_type, self.rotate = cache_type, rotate
        self.process = LlamaCppProcess(gguf_path, threads, cache_type=self.cache_type, n_ctx=n_ctx, rotate=rotate)
        self.lm = LlamaCppLM(self.process)

    kernel_path = "llama.cpp"

    def options(self) -> dict[str, Any]:
        import llama_cpp

        return {"threads": self.threads, "cache_type": self.cache_type,
                "flash_attention": uses_flash_attention(self.cache_type),
                "attention_rotation": attention_rotation(self.cache_type, self.rotate),
                "llama_cpp_python": llama_cpp.__version__, "gguf_file": self.path.name,
                "kv_cache_bytes": "llama.cpp's cache type x the positions held (formula)"}

    def weight_components(self) -> dict[str, int]:
        return gguf_weight_components(self.path)

    def generate(self, prompts: torch.Tensor, steps: int,
                 follow: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy continuations through llama.cpp's own cache (its cache type): ``(tokens [N, steps], log-probabilities
        [N, steps, vocab])``, each prompt from an empty cache; ``follow``: take its tokens instead (teacher-forced)."""
        found = ask_for_arrays(self.process, "generated.npz", cmd="generate", prompts=prompts.tolist(), steps=steps,
                                follow=None if follow is None else follow.tolist())
        return found["tokens"], found["logprobs"]

    def decode(self, config: Any, *, batch_size: int, prompt_tokens: int, new_tokens: int, warmup_runs: int,
               prefill_repeats: int, seed: int) -> DecodeResult:
        """Warm up, time ``prefill_repeats`` prefills (each a generation of its own), then one generation of
        ``new_tokens`` steps, the child's peak resident set tracked over the timed prefill and decode."""
        if batch_size != 1:
            raise UnsupportedError(f"engine {NAME} decodes one sequence (batch_size 1), not {batch_size}")
        prompt = prompt_ids(config.vocab_size, 1, prompt_tokens, seed, torch.device("cpu"))[0].tolist()
        for _ in range(warmup_runs):
            self.process.ask(cmd="decode", prompt=prompt, new_tokens=min(new_tokens, 8))
        prefills = [self.process.ask(cmd="decode", prompt=prompt, new_tokens=1)["prefill_ms"]
                    for _ in range(prefill_repeats - 1)]
        reset = self.process.reset_peak_rss()
        cpu0, wall0 = self.process.cpu_seconds(), time.perf_counter()
        with watch_machine(f"{NAME} decode {batch_size}x{prompt_tokens}") as load:
            got = self.process.ask(cmd="decode", prompt=prompt, new_tokens=new_tokens)
        cpu, wall = self.process.cpu_seconds() - cpu0, time.perf_counter() - wall0
        peak = self.process.peak_rss_bytes()
        machine = {**load[0].record(), "threads": self.threads,  # the child's CPU share, not this process's
                   "process_cpu_share": self.process.cpu_share(cpu, wall, self.threads)}
        prefills.append(got["prefill_ms"])
        tokens = prompt_tokens + new_tokens
        kv_bytes = kv_cache_bytes(config, tokens, self.cache_type)
        method = ("llama.cpp process peak RSS (VmHWM" + (", reset before the timed generation" if reset else
                                                          ", since it started") + "); includes its runtime")
        memory = {"peak_memory_bytes": peak, "peak_prefill_bytes": peak, "peak_decode_bytes": peak,
                  "peak_memory_method": method, "kv_cache_bytes": kv_bytes, "kv_cache_bytes_analytic": kv_bytes,
                  "kv_cache_tokens": tokens}
        return DecodeResult(statistics.median(prefills), got["steps_ms"], memory, NAME, self.options(), machine)

    def close(self) -> None:
        self.process.close()
