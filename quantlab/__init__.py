"""quantlab: what do you lose and gain by storing a model's weights and KV cache in format X?"""
from .errors import QuantlabError, RecipeError, UnsupportedError
from .kv import KV_FORMATS, KVFormat
from .quant import WEIGHT_FORMATS, QuantizedLinear, QuantizedTensor, WeightFormat, gptq_quantize, load_gptq, quantize_, quantize_tensor, save_gptq
from .recipe import Recipe, load_recipe, validate_recipe
from .runner import run_recipe

__version__ = "0.1.0"
__all__ = [
    "KV_FORMATS", "WEIGHT_FORMATS", "KVFormat", "QuantizedLinear", "QuantizedTensor", "QuantlabError", "Recipe",
    "RecipeError", "UnsupportedError", "WeightFormat", "gptq_quantize", "load_gptq", "load_recipe", "quantize_", "quantize_tensor", "run_recipe",
    "save_gptq", "validate_recipe",
]
