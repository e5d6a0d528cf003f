"""quantlab's C kernels, shipped as source and compiled at first use with the machine's C compiler (as torch's
inductor does), and registered as torch ops (``ops``).

``src/`` holds quantlab's own C, one file a kernel; ``third_party/`` holds vendored code, each with its LICENSE and
the upstream VERSION it was taken at (ggml's block code, which ``src/ggml.c`` includes).

The shared library is cached under ``$QUANTLAB_KERNEL_CACHE`` (default ``~/.cache/quantlab/kernels``), keyed by
the source, the compiler command and the CPU's model and flags, so it is built once per machine and rebuilt when
any of them changes. It links OpenMP by its usual name (``libgomp.so.1``), which resolves to the runtime torch has
already loaded: one thread pool, sized by ``torch.set_num_threads``. A missing compiler, or a failed build, is an
``UnsupportedError`` naming the reason, so the kernel choice moves on to a path that needs none.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import UnsupportedError

SOURCES = Path(__file__).parent / "src"
THIRD_PARTY = Path(__file__).parent / "third_party"
INCLUDES = (SOURCES, *sorted(p for p in THIRD_PARTY.iterdir() if p.is_dir()))  # -I for each
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
BUILD_TIMEOUT_S = 120


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTLAB_KERNEL_CACHE") or Path.home() / ".cache" / "quantlab" / "kernels")


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def _cpu_signature() -> str:
    """The CPU's model name and feature flags (``-march=native`` builds for exactly these)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(keep))


@functools.cache
def load(name: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """``native/<name>.c`` built for this machine and loaded; ``UnsupportedError`` when it cannot be built.

    ``flags``: compiler options added after the usual ones, e.g. ``("-mno-avx512f",)`` to build the AVX2 path of a
    kernel that also has an AVX-512 one (the tests run both)."""
    import torch  # noqa: F401  (torch's OpenMP runtime is loaded first, so the library binds to it)

    cc = compiler()
    if cc is None:
        raise UnsupportedError(f"the {name} kernel is compiled at first use and no C compiler was found "
                               "(install gcc, or set CC)")
    source = SOURCES / f"{name}.c"
    if not source.is_file():
        raise UnsupportedError(f"the {name} kernel's source {source} is missing (an install without quantlab's C "
                               "sources: reinstall from the wheel or the checkout)")
    included = [f.read_text() for d in INCLUDES for f in sorted(d.glob("*")) if f.suffix in (".h", ".c") and f != source]
    key = hashlib.sha256("\0".join([source.read_text(), *included, cc, *FLAGS, *flags, _cpu_signature()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            try:
                done = subprocess.run([cc, *FLAGS, *flags, *(f"-I{d}" for d in INCLUDES), str(source), "-o", str(built)],
                                      capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise UnsupportedError(f"building the {name} kernel with {cc} failed: {e}") from None
            if done.returncode != 0:
                detail = (done.stderr.strip().splitlines() or ["no message"])[0]
                raise UnsupportedError(f"building the {name} kernel with {cc} failed: {detail}")
            os.replace(built, target)  # atomic: concurrent builders each install a whole library
    return ctypes.CDLL(str(target))
