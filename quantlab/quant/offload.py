"""Quantizing a model that accelerate dispatched across devices or offloaded to CPU or disk.

A module whose weights accelerate offloaded holds them on the meta device and an ``AlignDevicesHook`` that
brings them in for each forward. To quantize it, its weights are brought in for the solve only (``onloaded``);
the quantized module that replaces it is placed on the hook's execution device, with a hook that moves its
inputs there (``placed``). So a model never has to fit on one device: each layer is materialized only while
it is quantized, and the quantized layers (a fraction of the size) stay where they run.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


def _hook(module: nn.Module) -> object | None:
    return getattr(module, "_hf_hook", None)


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate placed the model (a device map, possibly with offload)."""
    return bool(getattr(model, "hf_device_map", None))


def execution_device(module: nn.Module) -> torch.device:
    """Where the module computes: its hook's execution device, else where its first tensor is."""
    hook = _hook(module)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    tensor = next(iter(module.parameters()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


@contextlib.contextmanager
def onloaded(module: nn.Module) -> Iterator[None]:
    """The module's offloaded weights materialized on its execution device for the block."""
    from accelerate.utils import align_module_device, has_offloaded_params

    if has_offloaded_params(module):
        with align_module_device(module, execution_device(module)):
            yield
    else:
        yield


def placed(new: nn.Module, old: nn.Module) -> nn.Module:
    """``new`` (the quantized replacement of ``old``) on ``old``'s execution device, its inputs moved there."""
    hook = _hook(old)
    if hook is None:
        return new
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    device = execution_device(old)
    new = new.to(device)
    add_hook_to_module(new, AlignDevicesHook(execution_device=device, io_same_device=getattr(hook, "io_same_device", False)))
    return new


def cast_(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)``; a dispatched model (whose offloaded weights cannot be cast in place) must already be
    in ``dtype``."""
    if all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
        return
    if is_dispatched(model):
        from ..errors import UnsupportedError

        raise UnsupportedError(f"a model placed with device_map cannot be cast to {str(dtype).removeprefix('torch.')}: "
                               "load it in that dtype (model.dtype)")
    model.to(dtype)


def offloaded_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of parameters held on the meta device by an offload hook, by where they are kept (cpu or disk)."""
    from accelerate.utils import has_offloaded_params

    out: dict[str, int] = {}
    device_map = getattr(model, "hf_device_map", None) or {}
    disk = {name for name, where in device_map.items() if where == "disk"}
    for name, module in model.named_modules():
        if not has_offloaded_params(module):
            continue
        where = "disk" if any(name == d or name.startswith(d + ".") for d in disk) else "cpu"
        n = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        out[where] = out.get(where, 0) + n
    return out
