"""Extension points: the registries a new weight format, stored form (its kernel and codecs), export target, KV
format, engine, measurement, evaluation, perplexity protocol or executor registers with, the base classes it subclasses, and the run folder that records are read from.

Each registry names what it holds and lists the known names on a miss; a registered class is found by the
recipe, the runner, the reports and the CLI without any of them naming it (docs/extending/)."""
from __future__ import annotations

from .lazy import lazy_exports

_LAZY = {
    "WEIGHT_FORMATS": "quantlab.quant:WEIGHT_FORMATS", "WeightFormat": "quantlab.quant.format:WeightFormat",
    "QuantizedWeightFormat": "quantlab.quant.format:QuantizedWeightFormat",
    "WeightTensor": "quantlab.quant.tensors.base:WeightTensor", "Spec": "quantlab.quant.tensors.base:Spec",
    "CODECS": "quantlab.quant.codecs:CODECS", "Codec": "quantlab.quant.codecs:Codec",
    "register_codec": "quantlab.quant.codecs:register_codec",
    "CompressedTensorsCodec": "quantlab.quant.codecs.compressed_tensors:CompressedTensorsCodec",
    "GGUFCodec": "quantlab.quant.codecs.gguf:GGUFCodec", "IntegerCodec": "quantlab.quant.codecs.integer:IntegerCodec",
    "EXPORTERS": "quantlab.quant.codecs:EXPORTERS", "Exporter": "quantlab.quant.codecs:Exporter",
    "KERNELS": "quantlab.quant.kernels:KERNELS", "Kernel": "quantlab.quant.kernels:Kernel",
    "KV_FORMATS": "quantlab.kv:KV_FORMATS", "KVFormat": "quantlab.kv:KVFormat",
    "MEASUREMENTS": "quantlab.measurements:MEASUREMENTS", "Measurement": "quantlab.measurements:Measurement",
    "Result": "quantlab.measurements:Result", "Column": "quantlab.measurements:Column",
    "register_measurement": "quantlab.measurements:register", "MeasureContext": "quantlab.measurements:MeasureContext",
    "EVALUATIONS": "quantlab.eval.base:EVALUATIONS", "Evaluation": "quantlab.eval.base:Evaluation",
    "PERPLEXITY_PROTOCOLS": "quantlab.eval.perplexity:PERPLEXITY_PROTOCOLS",
    "PerplexityProtocol": "quantlab.eval.perplexity:PerplexityProtocol",
    "EXECUTORS": "quantlab.run.executors:EXECUTORS", "Sweep": "quantlab.run.sweep:Sweep",
    "ENGINES": "quantlab.engine:ENGINES", "Engine": "quantlab.engine:Engine",
    "DecodeResult": "quantlab.engine:DecodeResult",
    "RunFolder": "quantlab.records.folder:RunFolder",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
