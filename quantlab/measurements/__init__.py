"""Registered measurements. Importing this package registers the built-in ones, in report order."""
from . import weights, module_formats, kv_cache, peak_memory, latency, roofline, timing_noise, perplexity, divergence, lm_eval_tasks  # noqa: F401,I001  (registration, in order)
from .base import MEASUREMENTS, Column, Measurement, Result, all_measurements, enabled_measurements, register
from .context import VariantContext

__all__ = ["MEASUREMENTS", "Column", "Measurement", "Result", "VariantContext", "all_measurements",
           "enabled_measurements", "register"]
