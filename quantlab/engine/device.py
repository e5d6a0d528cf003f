"""Device choice and synchronization for honest timing."""
from __future__ import annotations

import time

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from ..errors import QuantlabError

        raise QuantlabError("device: cuda was asked for but torch sees no CUDA device")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for every CUDA device this process has used (a model placed across several runs a step on all)."""
    if device.type == "cuda":
        if torch.cuda.device_count() == 1:
            torch.cuda.synchronize(device)
            return
        for index in range(torch.cuda.device_count()):
            if torch.cuda.memory_allocated(index) or index == (device.index or 0):
                torch.cuda.synchronize(index)


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def timed_ms(fn, device: torch.device):  # type: ignore[no-untyped-def]
    """Run ``fn`` once; return (result, elapsed ms). CUDA: events around it on the current stream, after a
    synchronize; elsewhere: a monotonic clock, the device synchronized on both sides."""
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return result, start.elapsed_time(end)
    start_s = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, (time.perf_counter() - start_s) * 1e3
