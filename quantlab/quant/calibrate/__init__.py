"""Calibrated quantization: the layer-by-layer pass that feeds each decoder layer the outputs of the
already-quantized layers before it (GPTQ and AWQ build on it), and the GPTQ solve as a pure function."""
from .gptq_solve import gptq_quantize
from .layers import HessianAccumulator, LayerStep, calibrated_layers, decoder_layers, execution_groups

__all__ = ["HessianAccumulator", "LayerStep", "calibrated_layers", "decoder_layers", "execution_groups",
           "gptq_quantize"]
