"""Writes the tensor types llama.cpp's quantizer (llama-cpp-python 0.3.36) chooses for each named mix on two
models, from their float32 GGUF export: ``python -m tests.quant.formats.gguf_recipe_reference.make``. The models:
the bundled tiny Llama (6 layers, GQA 4, a feed-forward of 640: not whole super-blocks) and a random 32-layer
Llama without GQA (``thirty_two_layers``), so the rules by layer (first and last eighth, every third, first
sixteenth) and by head sharing are all exercised."""
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import torch

from quantlab import export_
from quantlab.paths import BUNDLED_DIR
from quantlab.quant.formats.gguf_recipes import RECIPES

HERE = Path(__file__).parent
TINY = BUNDLED_DIR / "tiny-stdlib-llama"


def thirty_two_layers(folder: Path) -> torch.nn.Module:
    """A random Llama of 32 layers (hidden 256, 4 heads without sharing, feed-forward 512), its tokenizer the
    bundled one, saved to ``folder``."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512,
                                         num_hidden_layers=32, num_attention_heads=4, num_key_value_heads=4,
                                         head_dim=64, tie_word_embeddings=False)).eval()
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, folder / name)
    return model


def llama_cpp_types(source: Path, recipe: str, out: Path) -> dict[str, str]:
    import gguf
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{recipe}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to {recipe}")
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors if t.name.endswith(".weight")}


def main() -> None:
    from transformers import AutoModelForCausalLM

    reference = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        models = {"tiny-stdlib-llama": (AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), TINY)}
        models["llama-32-layers"] = (thirty_two_layers(tmp_path / "l32"), tmp_path / "l32")
        for key, (model, source) in models.items():
            export_(model, "gguf", tmp_path / key, source=source)
            reference[key] = {r: llama_cpp_types(tmp_path / key / "model.gguf", r, tmp_path / f"{key}-{r}.gguf")
                              for r in RECIPES}
    (HERE / "types.json").write_text(json.dumps({"source": "llama-cpp-python 0.3.36 (llama_model_quantize)",
                                                 "types": reference}, indent=1) + "\n")
    print("wrote", HERE / "types.json", file=sys.stderr)


if __name__ == "__main__":
    main()
