"""Finding and running llama.cpp's command-line tools: the build folder first, then the PATH; a failed run raises
with its output."""
from pathlib import Path

import pytest

from quantlab.engine.llama_cpp.tools import find_tool, run_tool


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_the_build_folder_comes_before_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = _script(tmp_path / "build" / "bin" / "llama-perplexity", "echo built")
    _script(tmp_path / "path" / "llama-perplexity", "echo path")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.setenv("QUANTLAB_LLAMA_CPP_BUILD", str(tmp_path / "build"))
    assert find_tool("llama-perplexity") == built
    monkeypatch.setenv("QUANTLAB_LLAMA_CPP_BUILD", str(tmp_path / "elsewhere"))
    assert find_tool("llama-perplexity") == tmp_path / "path" / "llama-perplexity"
    assert find_tool("llama-quantize") is None


def test_a_run_returns_its_output_and_a_failure_raises_with_it(tmp_path: Path) -> None:
    ok = _script(tmp_path / "ok", 'echo "out $1"; echo err >&2')
    assert run_tool(ok, "a") == "out a\nerr\n"
    bad = _script(tmp_path / "bad", "echo 'no such file' >&2; exit 3")
    with pytest.raises(RuntimeError, match="bad exited with 3:\nno such file"):
        run_tool(bad)
