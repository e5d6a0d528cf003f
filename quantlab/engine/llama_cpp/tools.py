"""llama.cpp's own command-line tools (``llama-perplexity``), built with cmake from the llama.cpp that llama-cpp-python
vendors (``scripts/build_llama_perplexity.sh``), found where that script puts them, on ``$QUANTLAB_LLAMA_CPP_BUILD``
or on the PATH, and run to completion with their output kept."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BUILD_HINT = "build it with scripts/build_llama_perplexity.sh (cmake, about 6 minutes on 2 cores)"


def build_folder() -> Path:
    return Path(os.environ.get("QUANTLAB_LLAMA_CPP_BUILD", Path.home() / ".cache" / "quantlab" / "llama.cpp"))


def find_tool(name: str) -> Path | None:
    """``name`` (``llama-perplexity``) in the build folder's ``bin``, else on the PATH; None where it is neither."""
    built = build_folder() / "bin" / name
    if built.is_file() and os.access(built, os.X_OK):
        return built
    found = shutil.which(name)
    return Path(found) if found else None


def run_tool(tool: Path, *args: str, timeout_s: float = 3600) -> str:
    """Run ``tool`` with ``args``; its stdout and stderr together. A non-zero exit raises with the output's tail."""
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=timeout_s)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{tool.name} exited with {done.returncode}:\n{output[-3000:]}")
    return output
