"""Weight formats. Importing this package registers every built-in format and matmul kernel."""
from . import kernel_bitplane, kernel_gptqmodel  # noqa: F401  (kernel registration, before the formats that list kernels)
from . import awq, cast, checkpoint, codebook, fp8, gptq, gptqmodel_backend, hqq, mixed, rtn  # noqa: F401  (registration)
from .apply import QuantizeReport, quantize_
from .format import WEIGHT_FORMATS, WeightFormat
from .gptq_checkpoint import load_gptq, save_gptq
from .gptq_solve import gptq_quantize
from .linear import QuantizedLinear
from .qtensor import QuantizedTensor, quantize_tensor

__all__ = ["WEIGHT_FORMATS", "WeightFormat", "QuantizedLinear", "QuantizedTensor", "QuantizeReport",
           "gptq_quantize", "load_gptq", "quantize_", "quantize_tensor", "save_gptq"]
