"""quantlab's C kernels, shipped as source and compiled at first use with the machine's C compiler (as torch's
inductor does), and registered as torch ops (``ops``).

``src/`` holds quantlab's own C, one file a kernel; ``third_party/`` holds vendored code, each with its LICENSE and
the upstream VERSION it was taken at (ggml's block code, which ``src/ggml.c`` includes).

The shared library is cached under ``$QUANTLAB_KERNEL_CACHE`` (default ``~/.cache/quantlab/kernels``), keyed by
the source, the compiler command and the CPU's model and flags, so it is built once per machine and rebuilt when
any of them changes. It links OpenMP by its usual name (``libgomp.so.1``), which resolves to the runtime torch has
already loaded: one thread pool, sized by ``torch.set_num_threads``. A missing compiler, or a failed build, is an
``UnsupportedError`` naming the reason, so the kernel choice moves on to a path that needs none.

A kernel's decode-step products are also torch ops (``ops.native_op``: a schema, the Python function that calls the
library through ctypes, a fake). Where ``src/<name>_ops.cpp`` exists, ``load_ops`` builds it with the C++ compiler
against torch's headers, linked to the kernel's library, and loads it: it registers each op's CPU kernel in C++,
so a compiled step calls the C function from torch's dispatcher without entering Python (about 4 us a call less;
``benchmarks/op_overhead.py``). The Python function stays the op's kernel for other backends and wherever the C++
build is not possible; both call the same C function with the same arguments, so their results are the same bits.
``QUANTLAB_CPP_OPS=0`` keeps the Python kernels.
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
CXX_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++20")
BUILD_TIMEOUT_S = 120


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTLAB_KERNEL_CACHE") or Path.home() / ".cache" / "quantlab" / "kernels")


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def cxx_compiler() -> str | None:
    """The C++ compiler for the ops' shims: ``$CXX``, else ``c++``, ``g++`` or ``clang++`` on the PATH."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
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
    _build(target, [cc, *FLAGS, *flags, *(f"-I{d}" for d in INCLUDES), str(source)], f"the {name} kernel")
    return ctypes.CDLL(str(target))


def _build(target: Path, command: list[str], what: str) -> None:
    """Run ``command -o <file>`` unless ``target`` exists, installing the file as ``target`` atomically (concurrent
    builders each install a whole library)."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        try:
            done = subprocess.run([*command, "-o", str(built)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UnsupportedError(f"building {what} with {command[0]} failed: {e}") from None
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.strip().splitlines()
            raise UnsupportedError(f"building {what} with {command[0]} failed: {(errors or ['no message'])[0]}")
        os.replace(built, target)


@functools.cache
def load_ops(name: str) -> bool:
    """Register ``src/<name>_ops.cpp``'s C++ kernels for the ``<name>`` library's torch ops (built at first use,
    cached like the libraries); False where it has none, ``QUANTLAB_CPP_OPS=0`` is set, or it cannot be built, so
    the ops keep their Python kernels. Call it after the ops are defined."""
    source = SOURCES / f"{name}_ops.cpp"
    if os.environ.get("QUANTLAB_CPP_OPS", "1") == "0" or not source.is_file():
        return False
    try:
        return _load_ops(name, source)
    except UnsupportedError as e:
        OPS_FAILURES[name] = str(e)
        return False


OPS_FAILURES: dict[str, str] = {}  # why a library's C++ ops were not built, by name


def _load_ops(name: str, source: Path) -> bool:
    import torch
    from torch.utils import cpp_extension

    cxx = cxx_compiler()
    if cxx is None:
        raise UnsupportedError(f"the {name} kernel's torch ops are compiled with a C++ compiler and none was found")
    library = Path(load(name)._name)
    torch_lib = Path(torch.__file__).parent / "lib"
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
    includes = [f"-I{d}" for d in (SOURCES, *cpp_extension.include_paths())]
    command = [cxx, *CXX_FLAGS, abi, "-w", *includes, str(source), str(library), f"-L{torch_lib}", "-lc10",
               "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}", f"-Wl,-rpath,{library.parent}"]
    key = hashlib.sha256("\0".join([source.read_text(), (SOURCES / "torch_ops.h").read_text(), torch.__version__,
                                     *command]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}_ops-{key}.so"
    _build(target, command, f"the {name} kernel's torch ops")
    torch.ops.load_library(str(target))
    from .ops import forget_cpp_kernels
    forget_cpp_kernels()  # ops seen before now may have gained a C++ kernel
    return True
