"""llama.cpp's own ``llama-perplexity --kl-divergence`` and quantlab's llama.cpp engine, scored as the tool scores,
print the same figures for quantlab's GGUF exports of the bundled model; quantlab's base file equals the tool's.
Needs the tool (``scripts/build_llama_perplexity.sh``) and llama-cpp-python: skipped without them."""
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from quantlab import export_, quantize_  # noqa: E402
from quantlab.data import load_text  # noqa: E402
from quantlab.engine.llama_cpp.perplexity_check import Tool, compare_lines, engine_logits, quantlab_printout  # noqa: E402
from quantlab.engine.llama_cpp.tools import find_tool  # noqa: E402
from quantlab.fidelity.llama_perplexity import BaseLogits  # noqa: E402
from quantlab.paths import BUNDLED_DIR  # noqa: E402
from quantlab.quant.format import build_format  # noqa: E402

pytestmark = [pytest.mark.llama_cpp, pytest.mark.slow]

TINY = BUNDLED_DIR / "tiny-stdlib-llama"
TOOL = find_tool("llama-perplexity")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if TOOL is None:
        pytest.skip("llama-perplexity is not built (scripts/build_llama_perplexity.sh)")
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("perplexity-check")
    (folder / "text.txt").write_text(load_text("bundled-heldout").text, encoding="utf-8")
    files = {"text": folder / "text.txt"}
    for name, spec in {"base": None, "Q8_0": {"format": "gguf", "type": "Q8_0"},
                       "Q4_K": {"format": "gguf", "type": "Q4_K"}}.items():
        model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.bfloat16).eval()
        if spec is not None:
            quantize_(model, build_format(spec))
        export_(model, "gguf", folder / name, source=TINY)
        files[name] = folder / name / "model.gguf"
    return files


def test_quantlab_prints_the_figures_llama_perplexity_prints(exports: dict[str, Path], tmp_path: Path) -> None:
    tool = Tool(TOOL, n_ctx=256, chunks=4, threads=torch.get_num_threads())
    base = tool.write_base(exports["base"], exports["text"], tmp_path / "base.bin")
    assert base.n_chunk == 4 and base.n_ctx == 256
    base_logits = engine_logits(exports["base"], base, tool.threads)
    assert BaseLogits.from_logits(base.tokens, base_logits).to_bytes() == (tmp_path / "base.bin").read_bytes()
    for name in ("base", "Q8_0", "Q4_K"):
        theirs = tool.divergence(exports[name], exports["text"], tmp_path / "base.bin")
        assert len(theirs) == 34, theirs  # 6 perplexity, 12 KLD, 14 Δp lines, RMS Δp, same top p
        logits = base_logits if name == "base" else engine_logits(exports[name], base, tool.threads)
        assert compare_lines(quantlab_printout(logits, base), theirs) == [], name
