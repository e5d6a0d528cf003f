"""The machine a figure was measured on: what must match before a recorded result is reused.

Host name plus a stable machine id (``/etc/machine-id``, else the boot id), the CPU model and the thread
count torch uses, each CUDA device's name and UUID, and the torch, transformers and quantlab versions.
Two machines with the same host name (every fresh VM called ``vm``) still differ by machine id.
"""
from __future__ import annotations

import hashlib
import json
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def _read(path: str) -> str | None:
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def machine_id() -> tuple[str, str]:
    """(id, where it came from): the systemd machine id, else this boot's id, else the host name."""
    for path in MACHINE_ID_FILES:
        value = _read(path)
        if value:
            return value, path
    boot = _read(BOOT_ID_FILE)
    if boot:
        return boot, BOOT_ID_FILE
    return platform.node(), "host name (no machine or boot id)"


def cpu_model() -> str:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith(("model name", "Model", "Hardware")) and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, str]]:
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"name": props.name, "uuid": str(getattr(props, "uuid", ""))})
    return out


@lru_cache(maxsize=1)
def machine_fingerprint() -> dict[str, Any]:
    """What this process measures on (cached: it does not change while the process runs)."""
    import torch
    import transformers

    from .. import __version__

    ident, source = machine_id()
    return {
        "host": platform.node(), "machine_id": ident, "machine_id_source": source, "cpu_model": cpu_model(),
        "cpu_threads": torch.get_num_threads(), "gpus": gpus(), "torch": torch.__version__,
        "transformers": transformers.__version__, "quantlab": __version__,
    }


def fingerprint_id(fingerprint: dict[str, Any]) -> str:
    """A short stable hash of a fingerprint: records are reused only under the same one."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def describe(fingerprint: dict[str, Any]) -> str:
    """One line: host, CPU and GPUs, for logs and reports."""
    if fingerprint.get("legacy"):
        return f"{fingerprint.get('host') or 'unknown host'} (recorded before fingerprints)"
    gpu = ", ".join(g["name"] for g in fingerprint.get("gpus") or [])
    return (f"{fingerprint.get('host')} ({fingerprint.get('cpu_model')}, {fingerprint.get('cpu_threads')} threads"
            + (f"; {gpu}" if gpu else "") + ")")
