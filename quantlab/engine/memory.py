"""Memory: bytes held by the model's tensors (measured and analytic) and peak memory of a phase."""
from __future__ import annotations

import contextlib
import ctypes
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from ..quant.embedding import BlockEmbedding
from ..quant.kernels.base import Kernel
from ..quant.linear import linear_types

EMBEDDINGS = (nn.Embedding, BlockEmbedding)  # lookup tables: a step reads one row of each

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _component(module: nn.Module) -> str:
    if isinstance(module, EMBEDDINGS):
        return "embedding"
    if hasattr(module, "analytic_weight_bytes") or isinstance(module, Kernel):
        return "quantized_linear"
    if isinstance(module, linear_types()):
        return "linear"
    return "other"


def _own_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters(recurse=False)
    yield from module.buffers(recurse=False)


def _modules_and_tensors(model: nn.Module) -> Iterator[tuple[nn.Module, torch.Tensor]]:
    """Each module with the tensors it owns; a kernel owns its submodules' tensors too (a library's
    quantized layer inside a kernel counts as quantized weights, not as "other")."""
    inside_kernels: set[int] = set()
    for module in model.modules():
        if id(module) in inside_kernels:
            continue
        if isinstance(module, Kernel):
            inside_kernels.update(id(m) for m in module.modules())
            for t in list(module.parameters()) + list(module.buffers()):
                yield module, t
        else:
            for t in _own_tensors(module):
                yield module, t


def _distinct_storages(model: nn.Module) -> Iterator[tuple[nn.Module, torch.Tensor]]:
    """``_modules_and_tensors`` with each storage once (tied and shared tensors at their first owner); tensors
    on the meta device (weights accelerate offloaded) hold no memory and are left out."""
    seen: set[int] = set()
    for module, t in _modules_and_tensors(model):
        if t.device.type == "meta":
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            yield module, t


def weight_bytes_by_component(model: nn.Module) -> dict[str, int]:
    """Bytes of parameters and buffers by component, each storage counted once (tied weights too)."""
    out = {"quantized_linear": 0, "linear": 0, "embedding": 0, "other": 0}
    for module, t in _distinct_storages(model):
        out[_component(module)] += t.untyped_storage().nbytes()
    return out


def weight_bytes_by_device(model: nn.Module) -> dict[str, int]:
    """Bytes held on each device (``cpu``, ``cuda:0``, ...), and those accelerate offloaded (``offload:cpu``,
    ``offload:disk``): where a model placed with a device map keeps its weights."""
    from ..quant.offload import offloaded_bytes

    out: dict[str, int] = {}
    for _, t in _distinct_storages(model):
        out[str(t.device)] = out.get(str(t.device), 0) + t.untyped_storage().nbytes()
    for where, n in offloaded_bytes(model).items():
        out[f"offload:{where}"] = n
    return out


def decode_weight_bytes_read(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: everything but input-embedding tables (a lookup reads
    one row), unless the table is also the output head (tied), which reads it whole."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ptr = head.weight.untyped_storage().data_ptr() if head is not None and hasattr(head, "weight") else None
    return sum(t.untyped_storage().nbytes() for module, t in _distinct_storages(model)
               if not isinstance(module, EMBEDDINGS) or t.untyped_storage().data_ptr() == head_ptr)


def weight_bytes(model: nn.Module) -> int:
    """Bytes actually held by the model's tensors."""
    return sum(weight_bytes_by_component(model).values())


def weight_bytes_analytic(model: nn.Module) -> int:
    """Bytes the formats call for: each quantized layer's formula, numel x element size elsewhere."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if hasattr(module, "analytic_weight_bytes"):
            total += module.analytic_weight_bytes()
            seen.update(id(t) for t in (*module.parameters(), *module.buffers()))
            continue
        for t in _own_tensors(module):
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def cuda_devices_of(model: nn.Module) -> list[int]:
    """The CUDA devices holding the model's tensors."""
    return sorted({t.device.index for t in (*model.parameters(), *model.buffers()) if t.device.type == "cuda"})


def _vm_hwm_bytes() -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("VmHWM not in /proc/self/status")


def rss_bytes() -> int:
    if _STATUS.exists():
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so RSS reflects live memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    release_freed_memory()
    try:
        _CLEAR_REFS.write_text("5")  # resets the process's peak RSS (Linux >= 4.0)
        _vm_hwm_bytes()
        return True
    except OSError:
        return False


@dataclass
class PeakMemory:
    """Peak bytes seen during a ``with`` block, and how they were obtained."""

    device: torch.device
    peak_bytes: int = 0
    reserved_bytes: int | None = None  # CUDA: the caching allocator's peak reservation
    method: str = ""
    by_device: dict[str, int] | None = None  # CUDA with a model on several devices: each one's allocator peak
    cuda_devices: list[int] | None = None  # the CUDA devices to track (default: ``device``'s)

    @contextlib.contextmanager
    def track(self) -> Iterator["PeakMemory"]:
        if self.device.type == "cuda":  # a model placed with a device map spans several devices: track each
            devices = self.cuda_devices or [self.device.index if self.device.index is not None else torch.cuda.current_device()]
            for i in devices:
                torch.cuda.synchronize(i)
                torch.cuda.reset_peak_memory_stats(i)
            yield self
            peaks = {}
            for i in devices:
                torch.cuda.synchronize(i)
                peaks[f"cuda:{i}"] = torch.cuda.max_memory_allocated(i)
            used = {k: v for k, v in peaks.items() if v}
            self.peak_bytes = sum(used.values())
            self.reserved_bytes = sum(torch.cuda.max_memory_reserved(i) for i in devices)
            self.by_device = used if len(used) > 1 else None
            self.method = ("torch.cuda.max_memory_allocated (allocator peak; CUDA context excluded)"
                           + (", summed over the devices the model spans" if self.by_device else ""))
            return
        if _reset_peak_rss():
            yield self
            self.peak_bytes = _vm_hwm_bytes()
            self.method = "process peak RSS (VmHWM, reset per phase via /proc/self/clear_refs after malloc_trim); includes the runtime"
            return
        import resource

        yield self
        self.peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.method = "process peak RSS since start (ru_maxrss); includes the runtime"
