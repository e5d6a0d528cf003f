"""The compiled engine's decode step: ``torch.compile`` of the model's forward over a static cache, and what it sets.

On CPU the compiled engine also removes what dominates a small model's step once the weights are read
quickly (``benchmarks/profile_decode.py`` shows the shares): the attention runs as grouped products and
softmax, which inductor fuses into the step's graph, instead of the fused SDPA kernel's per-call setup;
half-precision linears and int8 weights multiply a single row as one fused loop over the weight
(``half_rows``: C, where the CPU has AVX-512; else ``fused_row_matmul``, a loop inductor writes) instead of
``aten::mm``'s batch-1 path; inductor writes a pointwise chain out once
rather than recomputing it inside such a loop; and dynamo skips its guards on module attributes and on the
engine's static cache, which it otherwise checks on every call. Skipping them is safe because the step is
captured whole, for one model, from its own code object (so no other model's entry can match it), and dropped
when the measurement ends; the model is not changed in between, and every generation passes a cache the engine
built alike (same format, same length).
"""
from __future__ import annotations

import contextlib
import functools
import re
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...quant.kernels import half_rows
from ...quant.kernels.base import fused_row_matmul, use_fused_row_matmul
from .attention import FUSED_NAME as FUSED_ATTENTION
from .attention import NAME as ATTENTION
from .attention import register as register_attention


def compile_options(device: torch.device) -> dict[str, Any]:
    """What the compiled engine sets: torch.compile of the decode step over a static cache; on CUDA also
    CUDA graphs (mode reduce-overhead) and gpt-fast's inductor flags, which decide int8 speed there; on CPU
    quantlab's grouped attention (``attention.py``: fused into the graph for decode rows, SDPA for the prefill),
    module guards skipped, half-precision linears as one-row products (``half_rows`` in C where it is
    vectorized, else ``fused_row_matmul``), the graph's wrapper in C++ without size asserts, and the thread count it ran with."""
    if device.type == "cuda":
        return {"mode": "reduce-overhead", "dynamic": False, "inductor": {
            "coordinate_descent_tuning": True, "triton.unique_kernel_names": True, "fx_graph_cache": True}}
    # realize_opcount_threshold: a chain of more than 4 pointwise ops (RMSNorm's scaling, SiLU x up) is written out
    # once, not inlined into the one-row matmul's loop over the weight, which would recompute it for every row.
    # size_asserts: the Python wrapper of the graph checks no sizes and strides at every step (two checks per
    # kernel's output, about 600 a step of SmolLM2-135M: 14.6 -> 12.8 ms, interleaved runs of profile_decode.py).
    # cpp_wrapper: the graph's wrapper in C++ rather than Python, built apart from the kernels, which keeps its
    # compile short (about 15 s more a compile on 2 cores; built with them, about 6 minutes): a GGUF Q4_K_M step
    # of SmolLM2's shape 11-15% faster in three interleaved pairs of profile_decode.py runs (15.9 / 18.3,
    # 16.5 / 19.4, 13.9 / 15.6 ms).
    return {"mode": "default", "dynamic": False, "attention": ATTENTION, "module_guards": "skipped",
            "half_linears": "half_rows" if half_rows.available() else "fused_row_matmul", "threads": torch.get_num_threads(),
            "inductor": {"fx_graph_cache": True, "realize_opcount_threshold": 4, "size_asserts": False,
                         "cpp_wrapper": True, "cpp_wrapper_build_separate": True}}


def compiled_step(model: nn.Module, device: torch.device, options: dict[str, Any] | None = None,
                  own_kwargs: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The model's forward under torch.compile with the engine's mode, or ``options`` in place of
    ``compile_options`` (compile within ``inductor_options``).

    The step gets a code object of its own: dynamo keys its compiled entries by code object, so each model
    compiles its own graphs (and its own recompile budget) however many models a process measures. Module
    guards are skipped only for a step captured whole (``fullgraph``): a graph break would leave resume
    functions in library code, shared by every module of that class and, unguarded, run for a module they
    were not traced for. A step that breaks is compiled again with its guards, and ``options`` says so.
    ``own_kwargs``: keyword arguments (the engine's static cache) whose objects every call passes in the same
    structure, so that the guards on them are skipped with the module guards (a quantized cache's attributes
    made 3,500 guards in SmolLM2's step, 0.7 ms of its checks a step; see ``skip_guards``)."""
    options = options if options is not None else compile_options(device)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return model.forward(*args, **kwargs)

    step = types.FunctionType(forward.__code__.replace(), forward.__globals__, "decode_step", None, forward.__closure__)
    guarded = torch.compile(step, mode=options["mode"], dynamic=options["dynamic"])
    if options.get("module_guards") != "skipped":
        return guarded
    whole = torch.compile(step, dynamic=options["dynamic"], fullgraph=True,
                          options={"guard_filter_fn": functools.partial(skip_guards, own_kwargs=own_kwargs)})
    current = whole

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal current
        try:
            return current(*args, **kwargs)
        except torch._dynamo.exc.Unsupported:  # a graph break (raised while compiling: nothing ran)
            if current is guarded:
                raise
            current = guarded
            options["module_guards"] = "kept (graph breaks)"
            return current(*args, **kwargs)

    return run


def skip_guards(entries: list[Any], own_kwargs: tuple[str, ...] = ()) -> list[bool]:
    """Dynamo's guard filter for the whole step: keep a guard unless it is on a module's attributes
    (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``) or on an object reached from a keyword argument
    named in ``own_kwargs``."""
    keep = torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries)
    return [k and _root_kwarg(e.name) not in own_kwargs for k, e in zip(keep, entries)]


def _root_kwarg(name: str) -> str | None:
    """The keyword argument a guard's source starts from (``kwargs['cache'].layers[0].slots``: ``cache``)."""
    match = re.match(r"kwargs\['(\w+)'\]", name)
    return match.group(1) if match else None


def inductor_options(device: torch.device, settings: dict[str, Any] | None = None
                     ) -> contextlib.AbstractContextManager[Any]:
    """The engine's inductor settings (or ``settings``) for the duration of a ``with`` block, restored after it
    (the caller's global inductor config is left as it was)."""
    import torch._inductor.config as inductor

    return inductor.patch(compile_options(device)["inductor"] if settings is None else settings)


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str | None) -> Any:
    """Run the ``with`` block with the model's attention set to ``name`` (None: as it is), restored after.
    Yields the implementation in effect: the model's own where it cannot take ``name``."""
    before = getattr(model.config, "_attn_implementation", None)
    if name in (ATTENTION, FUSED_ATTENTION):
        register_attention()
    if name is None or before == name or not hasattr(model, "set_attn_implementation"):
        yield before
        return
    try:
        model.set_attn_implementation(name)
    except (ValueError, ImportError):  # the architecture does not offer it: keep the model's own
        yield before
        return
    try:
        yield name
    finally:
        model.set_attn_implementation(before)


def _row_linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    if not use_fused_row_matmul(rows):
        return F.linear(x, self.weight, self.bias)
    if getattr(self, "_half_rows", False) and half_rows.takes(rows, self.weight):
        y = half_rows.matmul_op(rows, self.weight)
    else:
        y = fused_row_matmul(rows, self.weight)
    y = y if self.bias is None else y + self.bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], -1)


@contextlib.contextmanager
def fused_row_linears(model: nn.Module, kernel: str = "fused_row_matmul") -> Any:
    """For the ``with`` block, the model's half-precision ``nn.Linear`` layers multiply a single row (a batch-1
    decode step) when compiled by ``kernel``: ``half_rows`` (the C kernel, where ``half_rows.available()``) or
    ``fused_row_matmul`` (which inductor turns into one loop over the weight); otherwise, and after the block,
    ``F.linear`` as before. Yields the number of layers changed. Layers with an accelerate hook (offloaded) keep
    their forward."""
    c_rows = kernel == "half_rows" and half_rows.available()
    changed = [m for m in model.modules() if type(m) is nn.Linear and not hasattr(m, "_hf_hook")
               and m.weight.dtype in (torch.bfloat16, torch.float16) and "forward" not in vars(m)]
    for m in changed:
        m.forward = types.MethodType(_row_linear, m)
        m._half_rows = c_rows
    try:
        yield len(changed)
    finally:
        for m in changed:
            del m.forward, m._half_rows
