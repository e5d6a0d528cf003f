"""quantlab: what do you lose and gain by storing a model's weights and KV cache in format X?

The library, in the style of torchao's ``quantize_(model, Int4WeightOnlyConfig(group_size=128))``::

    from quantlab import quantize_, RTN, GPTQ, calibration_from_text
    quantize_(model, RTN(bits=4, group_size=128))
    quantize_(model, GPTQ(bits=4, group_size=128), calibration_from_text(tokenizer, "stdlib-train"))

Weight formats (``RTN``, ``GPTQ``, ``AWQ``, ``HQQ``, ``NF4``, ``FP4``, ``FP8``, ``Mixed``, ...) and KV-cache formats
(``NativeKV``, ``KVCast``, ``KVInt``, ``HFQuantizedKV``) are frozen configs; recipes and runs are ``load_recipe`` and
``run_recipe``; the registries and base classes for new formats, kernels, measurements, protocols and executors
are in ``quantlab.extend``. The names load on first use, so ``import quantlab`` (and ``quantlab --help``) does not
import torch.
"""
from __future__ import annotations

from .errors import QuantlabError, RecipeError, UnsupportedError
from .lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    # the library
    "quantize_": "quantlab.quant.apply:quantize_", "QuantizeReport": "quantlab.quant.apply:QuantizeReport",
    "Calibration": "quantlab.quant.format:Calibration",
    "calibration_from_text": "quantlab.quant.calibrate.samples:calibration_from_text",
    "quantize_tensor": "quantlab.quant.forms.affine.tensor:quantize_tensor",
    "QuantizedTensor": "quantlab.quant.forms.affine.tensor:QuantizedTensor",
    "QuantizedLinear": "quantlab.quant.linear:QuantizedLinear",
    "gptq_quantize": "quantlab.quant.calibrate.gptq_solve:gptq_quantize",
    "save_gptq": "quantlab.quant.io.gptq:save_gptq", "load_gptq": "quantlab.quant.io.gptq:load_gptq",
    "export_": "quantlab.quant.io:export_",
    # weight formats
    "Cast": "quantlab.quant.formats.cast:CastFormat",
    "RTN": "quantlab.quant.formats.rtn:RTNFormat",
    "HQQ": "quantlab.quant.formats.hqq:HQQFormat",
    "GPTQ": "quantlab.quant.formats.gptq:GPTQFormat",
    "GPTQModel": "quantlab.quant.formats.gptqmodel:GPTQModelFormat",
    "AWQ": "quantlab.quant.formats.awq:AWQFormat",
    "Codebook": "quantlab.quant.formats.codebook:CodebookFormat",
    "NF4": "quantlab.quant.formats.codebook:NF4", "FP4": "quantlab.quant.formats.codebook:FP4",
    "FP8": "quantlab.quant.formats.fp8:FP8Format",
    "Mixed": "quantlab.quant.mixed.format:MixedFormat",
    "Checkpoint": "quantlab.quant.formats.checkpoint:CheckpointFormat",
    # KV-cache formats
    "NativeKV": "quantlab.kv.native:NativeKV", "KVCast": "quantlab.kv.quantized:KVCast",
    "KVInt": "quantlab.kv.quantized:KVInt", "HFQuantizedKV": "quantlab.kv.hf_quantized:HFQuantizedKV",
    # recipes and runs
    "Recipe": "quantlab.run.recipe:Recipe", "load_recipe": "quantlab.run.recipe:load_recipe",
    "validate_recipe": "quantlab.run.recipe:validate_recipe", "run_recipe": "quantlab.api:run_recipe",
}

__all__ = ["QuantlabError", "RecipeError", "UnsupportedError", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
