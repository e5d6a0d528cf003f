"""The C kernels as torch ops (``torch.ops.quantlab.*``), so a compiled graph calls them.

Each is defined on torch's dispatcher directly: a schema read from the Python function's signature, that function
as the kernel of every backend, and a fake (shapes only) for the compiler. A compiled decode step calls one op per
linear (over 200 a step for a 30-layer model), so the call's own cost counts: inside a compiled graph this
definition costs about 2 us a call less than ``torch.library.custom_op``'s wrapper, and about 5 us less when called
as ``torch.ops.quantlab.*`` from Python (``benchmarks/op_overhead.py``, one thread: 10.2 against 12.4 us a call of
a small Q4_K product in a compiled chain, the plain function 9.2 uncompiled).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._ops import OpOverload

try:  # torch >= 2.5
    from torch.library import infer_schema
except ImportError:  # pragma: no cover  (torch 2.4)
    from torch._library.infer_schema import infer_schema

NAMESPACE = "quantlab"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_CPP_KERNEL: dict[OpOverload, bool] = {}  # whether an op's CPU kernel is C++ (``native.load_ops``), by op


def native_op(name: str, kernel: Callable[..., torch.Tensor]) -> OpOverload:
    """``kernel`` (a function of tensors and plain values, returning a new tensor, mutating nothing) as the op
    ``quantlab::name``; give it a fake with ``register_fake(op)`` before it is compiled."""
    _LIBRARY.define(name + infer_schema(kernel, mutates_args=()))
    _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def register_fake(op: OpOverload) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """Decorator: the function giving ``op``'s output (shape, dtype, device) without running it."""
    def register(fake: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        torch.library.register_fake(op, fake, lib=_LIBRARY)
        return fake
    return register


def has_cpp_kernel(op: OpOverload) -> bool:
    """Whether ``op`` runs a C++ CPU kernel (``native.load_ops`` registered one), so calling it costs less than
    calling its Python function."""
    found = _CPP_KERNEL.get(op)
    if found is None:
        found = _CPP_KERNEL[op] = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU")
    return found


def forget_cpp_kernels() -> None:
    """Look again at which ops have a C++ kernel (``native.load_ops`` registered more)."""
    _CPP_KERNEL.clear()
