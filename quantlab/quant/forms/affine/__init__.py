"""Integer codes with a scale and a zero point per channel or group: integer zero points (``tensor``:
``QuantizedTensor``) or float ones (``float_zero``: quanto's and HQQ's ``FloatZeroTensor``); the GPTQ and AWQ
checkpoint layouts of the same numbers (``gptq_layout``, ``awq_layout``); kernels: torch's int4/int8 ops
(``torch_int``), the bit-plane C kernel (``bitplane``), the int8-activation product (``int8_act``) and GPTQModel's
(``gptqmodel``); ``codecs``: written to
compressed-tensors, GGUF, GPTQ and AWQ."""
from . import bitplane, codecs, gptqmodel, int8_act, torch_int  # noqa: F401  (registration)
from .float_zero import FloatZeroTensor, quantize_float_zero
from .tensor import QuantizedTensor, quantize_tensor

__all__ = ["FloatZeroTensor", "QuantizedTensor", "quantize_float_zero", "quantize_tensor"]
