"""Registered measurements: each a typed result, its report columns and its provenance. Importing this package
registers the built-in ones; their place in the reports is each class's declared ``order``."""
from . import (
    confidence,
    divergence,
    generation,
    kv_cache,
    latency,
    lm_eval_tasks,
    module_formats,
    peak_memory,
    perplexity,
    roofline,
    timing_noise,
    weights,
)
from .base import MEASUREMENTS, Column, Measurement, Result, all_measurements, enabled_measurements, register
from .context import MeasureContext

__all__ = ["MEASUREMENTS", "Column", "MeasureContext", "Measurement", "Result", "all_measurements",
           "enabled_measurements", "register"]
