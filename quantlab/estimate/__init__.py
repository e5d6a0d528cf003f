"""``quantlab estimate``: read a model's config (no weights) into an evidence table and a memory worksheet."""
from .evidence import Architecture, Evidence, read_architecture, read_raw_config
from .render import render_estimate
from .worksheet import Estimate, estimate, estimate_from_raw

__all__ = ["Architecture", "Estimate", "Evidence", "estimate", "estimate_from_raw", "read_architecture",
           "read_raw_config", "render_estimate"]
