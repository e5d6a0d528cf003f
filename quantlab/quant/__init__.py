"""Weight quantization: the format interface, ``quantize_``, the quantized linear and offload, with
subpackages for the formats, stored tensors, matmul kernels, the calibrated pass, mixed precision and
checkpoint I/O. Importing this package registers every built-in format and kernel (in any order: kernel
names are checked when a format is validated, and ``auto`` follows each kernel's declared preference)."""
from . import formats, forms, kernels, mixed  # noqa: F401  (registration)
from .apply import QuantizeReport, quantize_
from .calibrate.gptq_solve import gptq_quantize
from .format import WEIGHT_FORMATS, Calibration, WeightFormat
from .forms.affine.tensor import QuantizedTensor, quantize_tensor
from .io.gptq import load_gptq, save_gptq
from .linear import QuantizedLinear

__all__ = ["WEIGHT_FORMATS", "Calibration", "WeightFormat", "QuantizedLinear", "QuantizedTensor", "QuantizeReport",
           "gptq_quantize", "load_gptq", "quantize_", "quantize_tensor", "save_gptq"]
