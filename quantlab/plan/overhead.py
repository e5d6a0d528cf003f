"""The plan's memory beside the weights and the cache: the activations and workspace of the workload's largest
forward, and the runtime the engine's process holds before any model (each a figure and how it was obtained).

Activations (analytic): the largest forward is a chunk of the prompt, ``T = max(prefill_chunk_tokens,
batch_size)`` tokens at once (a decode step is ``batch_size`` tokens). One layer at a time holds the residual
stream and its normed copy (``2 T d``), then either the attention's queries, keys and values (``T (h_q + 2 h_kv)
d_head``) with its scores in float32 (``h_q T S``, ``S`` the keys attended: the context, or the layer's window)
or the MLP's gate, up and product (``3 T d_ff``), whichever is larger; and the output head's float32 logits of each
sequence's last position (``batch_size V``). The scores term assumes an attention that materializes them (eager,
or SDPA's math path, as on CPU); a flash kernel holds a tile of them instead, so there it is an upper bound.

Runtime (measured): the resident memory of a fresh process of this Python that has imported torch and quantlab,
plus the CUDA context where the plan is for a GPU (``torch.cuda.mem_get_info`` before and after it is made).
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..kv.format import layer_windows


@dataclass(frozen=True)
class Term:
    bytes: int
    method: str


def activation_bytes(config: Any, batch_size: int, context_tokens: int, prefill_chunk_tokens: int,
                     dtype: torch.dtype) -> Term:
    """The largest forward's activations at the workload (module docstring)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    d, d_ff, vocab = text.hidden_size, text.intermediate_size, text.vocab_size
    h_q, h_kv = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    d_head = getattr(text, "head_dim", None) or d // h_q
    keys = max(min(context_tokens, w) if w else context_tokens for w in layer_windows(config))
    tokens = max(prefill_chunk_tokens, batch_size)
    size = dtype.itemsize
    attention = tokens * (h_q + 2 * h_kv) * d_head * size + h_q * tokens * keys * 4
    mlp = 3 * tokens * d_ff * size
    total = 2 * tokens * d * size + max(attention, mlp) + batch_size * vocab * 4
    return Term(total, f"analytic: one layer of a {tokens}-token forward (residual 2·T·d, then the larger of "
                       f"attention with float32 scores over {keys:,} keys and the MLP's 3·T·d_ff, at "
                       f"{str(dtype).removeprefix('torch.')}) plus {batch_size} float32 logit rows of {vocab:,}; "
                       "the scores as materialized (a flash kernel holds less)")


_PROBE = """
import json, torch, quantlab
rss = 0
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        rss = int(line.split()[1]) * 1024
context = 0
if CUDA:
    free = torch.cuda.mem_get_info()[0]  # makes the context
    torch.empty(1, device="cuda")
    context = torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0] - torch.cuda.memory_reserved()
print(json.dumps({"rss": rss, "cuda_context": context}))
"""


def runtime_bytes(device: torch.device) -> Term:
    """The runtime's own memory, measured in a fresh process (module docstring)."""
    code = _PROBE.replace("CUDA", "True" if device.type == "cuda" else "False")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return Term(0, f"not measured: the probe process failed ({done.stderr.strip().splitlines()[-1:]})")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if device.type == "cuda":
        return Term(found["cuda_context"], "measured: the CUDA context of a fresh process (device memory in use "
                                           "after it is made, less torch's reserve)")
    if not found["rss"]:
        return Term(0, "not measured: no /proc/self/status on this system")
    return Term(found["rss"], f"measured: resident memory of a fresh Python {sys.version.split()[0]} process after "
                              f"importing torch {torch.__version__} and quantlab")
