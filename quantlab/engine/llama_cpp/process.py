"""llama.cpp (through llama-cpp-python) in a process of its own: timed greedy decoding and the scores of token
windows, for a GGUF file quantlab exported or a user gave.

Its own process, because llama.cpp's thread pool and torch's OpenMP pool in one process starve each other on a
small machine. The child reads one JSON command per line on stdin and answers one JSON line:

- ``decode``: ``{prompt, new_tokens}`` → ``{prefill_ms, steps_ms, tokens}``, each greedy step timed alone, and
  the greedy tokens (the one after the prompt, then one per step);
- ``nll``: ``{windows, window}`` → ``{nll_sum, tokens, top1}``: the summed negative log-likelihood of every token
  of each window but its first (quantlab's ``windows`` protocol, from llama.cpp's own logits), and llama.cpp's
  most likely next token at each scored position;
- ``logits``: ``{windows, window, path[, all_positions]}`` → ``{path}``: the scored positions' logits, float32
  ``[windows, window − 1, vocab]`` (``all_positions``: every position's, ``[windows, window, vocab]``), saved
  with numpy to ``path``.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from ...errors import UnsupportedError

INSTALL = ('llama-cpp-python is not installed: pip install -e ".[bench]" builds it from source (minutes; '
           'CMAKE_ARGS="-DGGML_NATIVE=ON" tunes it to this CPU)')


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


# llama.cpp's KV cache types: bytes per stored value (ggml block bytes / values per block)
CACHE_BYTES_PER_VALUE = {"f16": 2.0, "f32": 4.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                         "q4_1": 20 / 32, "q4_0": 18 / 32}
CACHE_TYPES = tuple(CACHE_BYTES_PER_VALUE)
FLOAT_CACHE_TYPES = ("f16", "f32", "bf16")  # the others need llama.cpp's flash attention


def uses_flash_attention(cache_type: str) -> bool:
    return cache_type not in FLOAT_CACHE_TYPES


def kv_cache_bytes(config: Any, tokens: int, cache_type: str) -> int:
    """Bytes of llama.cpp's K/V cache of ``cache_type`` holding ``tokens`` positions of every layer (sliding
    layers: their window), from the config (the native format's count of values)."""
    import torch

    from ...kv.native import NativeKV

    values = NativeKV().cache_bytes_analytic(config, 1, tokens, torch.float32) // 4
    return int(values * CACHE_BYTES_PER_VALUE[cache_type])


def worker(path: str, threads: int, cache_type: str = "f16", n_ctx: int = 1024) -> None:
    """The child's loop (``python -m quantlab.engine.llama_cpp PATH THREADS CACHE_TYPE N_CTX``: ``__main__.py``)."""
    import llama_cpp
    from llama_cpp import Llama

    kv = getattr(llama_cpp, f"GGML_TYPE_{cache_type.upper()}")
    options = dict(n_threads=threads, n_threads_batch=threads, type_k=kv, type_v=kv, verbose=False,
                   flash_attn=uses_flash_attention(cache_type))
    timing = Llama(model_path=path, n_ctx=n_ctx, n_batch=512, **options)
    scoring: dict[int, Any] = {}  # one context per window length, keeping every position's logits
    generating: dict[int, Any] = {}  # contexts for greedy continuations longer than the timing context holds
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "decode":
            reply = _decode(timing, cmd["prompt"], cmd["new_tokens"])
        elif cmd["cmd"] == "generate":
            need = len(cmd["prompts"][0]) + cmd["steps"]
            llm = timing if need <= n_ctx else generating.setdefault(
                need, Llama(model_path=path, n_ctx=need, n_batch=512, **options))
            reply = _generate(llm, cmd["prompts"], cmd["steps"], cmd.get("follow"), cmd["path"])
        else:
            window = cmd["window"]
            if window not in scoring:
                scoring[window] = Llama(model_path=path, n_ctx=window, n_batch=window, n_ubatch=window,
                                        logits_all=True, **options)
            reply = _score(scoring[window], cmd["windows"], cmd["path"] if cmd["cmd"] == "logits" else None,
                           cmd.get("all_positions", False))
        print(json.dumps(reply), flush=True)


def _decode(llm: Any, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """One greedy generation, the prefill and each step timed alone."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill_ms = (time.perf_counter() - start) * 1e3
    steps, tokens = [], [_greedy(llm)]
    for _ in range(new_tokens):
        start = time.perf_counter()
        llm.eval(tokens[-1:])
        steps.append((time.perf_counter() - start) * 1e3)
        tokens.append(_greedy(llm))
    return {"prefill_ms": prefill_ms, "steps_ms": steps, "tokens": tokens}


def _generate(llm: Any, prompts: list[list[int]], steps: int, follow: list[list[int]] | None, path: str) -> dict[str, Any]:
    """For each prompt from an empty cache: ``steps`` tokens, each the most likely next one (or ``follow``'s), with
    the log-probabilities before it; saved to ``path`` (``tokens [N, steps]``, ``logprobs [N, steps, vocab]``)."""
    import numpy as np

    tokens = np.zeros((len(prompts), steps), dtype=np.int64)
    logprobs = np.zeros((len(prompts), steps, llm.n_vocab()), dtype=np.float32)
    for i, prompt in enumerate(prompts):
        llm.reset()
        llm.eval(prompt)
        for step in range(steps):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)
            top = logits.max()
            logprobs[i, step] = logits - top - np.log(np.exp(logits - top).sum())
            tokens[i, step] = int(np.argmax(logits)) if follow is None else follow[i][step]
            if step + 1 < steps:
                llm.eval([int(tokens[i, step])])
    np.savez(path, tokens=tokens, logprobs=logprobs)
    return {"path": path}


def _score(llm: Any, windows: list[list[int]], path: str | None, all_positions: bool = False) -> dict[str, Any]:
    """Each window's logits at its scored positions (all but the last token's; ``all_positions``: every one):
    saved to ``path`` when given, else reduced to the summed NLL of the next tokens and llama.cpp's top token at
    each position."""
    import numpy as np

    total, count, top1, kept = 0.0, 0, [], []
    for ids in windows:
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids) - (0 if all_positions and path is not None else 1)])
        if path is not None:
            kept.append(logits.astype(np.float32))
            continue
        logits = logits.astype(np.float64)
        top = logits.max(axis=1, keepdims=True)
        logz = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        total += float((logz - logits[np.arange(len(ids) - 1), ids[1:]]).sum())
        count += len(ids) - 1
        top1.append(logits.argmax(axis=1).tolist())
    if path is not None:
        np.save(path, np.stack(kept))
        return {"path": path}
    return {"nll_sum": total, "tokens": count, "top1": top1}


def _greedy(llm: Any) -> int:
    """The most likely next token after the last evaluated one, from llama.cpp's own logits buffer (without
    ``logits_all``, llama-cpp-python keeps no copy in ``scores``)."""
    import numpy as np

    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))


class LlamaCppProcess:
    """A GGUF file loaded by llama.cpp in a child process, its KV cache in ``cache_type`` (llama.cpp's default
    f16, or f32 to score the weights alone) and ``n_ctx`` positions for decoding; ``ask(cmd=..., ...)`` sends one
    command."""

    def __init__(self, path: str | Path, threads: int, cache_type: str = "f16", n_ctx: int = 1024,
                 rotate: bool = True) -> None:
        """``rotate``: llama.cpp's Walsh-Hadamard rotation of a quantized cache (its default); False sets
        ``LLAMA_ATTN_ROT_DISABLE=1`` in the child (a float cache is never rotated)."""
        import os

        if not available():
            raise UnsupportedError(INSTALL)
        if cache_type not in CACHE_TYPES:
            raise UnsupportedError(f"llama.cpp cache type {cache_type!r}: one of {', '.join(CACHE_TYPES)}")
        self.path = Path(path)
        self.threads = threads
        self.cache_type = cache_type
        env = {k: v for k, v in os.environ.items() if k != "LLAMA_ATTN_ROT_DISABLE"}
        if not rotate:
            env["LLAMA_ATTN_ROT_DISABLE"] = "1"
        self.rotate = rotate and cache_type not in FLOAT_CACHE_TYPES
        self.proc = subprocess.Popen([sys.executable, "-m", "quantlab.engine.llama_cpp", str(path), str(threads),
                                      cache_type, str(n_ctx)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise UnsupportedError(f"llama.cpp could not run {self.path}: {self._ended()}")
        return json.loads(line)

    def _ended(self) -> str:
        """How the child ended, once it has closed its output (a crash in llama.cpp prints nothing)."""
        import signal

        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return "its process stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            hint = (" (llama.cpp crashed; on a CPU with AMX, ggml's AMX buffer type is a known cause: build "
                    "llama-cpp-python without it, docs/benchmarks.md, llama.cpp as an engine)") if name == "SIGSEGV" else ""
            return f"its process was killed by {name}{hint}"
        return f"its process exited with status {code} (its error is above)"

    def ask(self, **cmd: Any) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._read()

    def peak_rss_bytes(self) -> int:
        """The child's peak resident set (``VmHWM``): llama.cpp's weights, KV cache and buffers with its runtime."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise OSError(f"VmHWM not in /proc/{self.proc.pid}/status")

    def cpu_seconds(self) -> float:
        """CPU time the child has used (user + system), from ``/proc/PID/stat``."""
        import os

        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def cpu_share(cpu_s: float, wall_s: float, threads: int) -> float | None:
        """CPU time over wall time x threads for a section of the child, or None where the section spans too few
        of the kernel's clock ticks (``/proc`` counts CPU time in ticks) for the share to mean anything."""
        import os

        if wall_s * os.sysconf("SC_CLK_TCK") < MIN_TICKS:
            return None
        return round(cpu_s / (wall_s * threads), 3)

    def reset_peak_rss(self) -> bool:
        """Start the child's peak resident set again from its current one; False where the kernel refuses."""
        try:
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=60)

    def __enter__(self) -> LlamaCppProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


MIN_TICKS = 100  # clock ticks a timed section must span for a CPU share (at 100 Hz: 1 s, about 1% resolution)
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def gguf_weight_components(path: str | Path) -> dict[str, int]:
    """The file's tensor bytes by component, as quantlab counts a model's: ``quantized_linear`` (2-D tensors in
    a ggml block type), ``linear`` (the other 2-D tensors but the token embedding), ``embedding`` and ``other``
    (norms, rotary factors, biases)."""
    from gguf import GGUFReader

    out = {"quantized_linear": 0, "linear": 0, "embedding": 0, "other": 0}
    for t in GGUFReader(str(path)).tensors:
        n = int(t.n_bytes)
        if t.name.startswith("token_embd."):
            out["embedding"] += n
        elif len(t.shape) >= 2 and t.name.endswith(".weight"):
            out["linear" if t.tensor_type.name in FLOAT_TYPES else "quantized_linear"] += n
        else:
            out["other"] += n
    return out


def gguf_tensor_bytes(path: str | Path) -> int:
    """Bytes of every tensor in the GGUF file: what one llama.cpp decode step reads (a tied embedding is the
    output matrix, read whole; the KV cache is apart)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)

