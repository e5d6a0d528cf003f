"""What a measurement reads of the variant it measures: the narrow protocol between the variant's lifecycle
(``run.lifecycle.VariantContext`` loads, quantizes and serves it) and the measurements, which only measure."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch


class MeasureContext(Protocol):
    """One variant, loaded and quantized, as the measurements see it."""

    recipe: Any  # the recipe (its workload and evaluations)
    variant: Any  # the variant: its weight and KV formats, its engine and label
    device: torch.device
    run_folder: Path | None  # where run-wide intermediates live (the baseline's distributions)
    quantize_report: Any  # what quantizing did, module by module
    quantize_s: float
    weights_source: dict[str, Any]  # quantized here, or reused from the run folder
    rss_before_load_bytes: int

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def tokenizer(self) -> Any | None: ...

    @property
    def scoring_model(self) -> Any:
        """What quality evaluations score: the model, or an engine's logits of the same windows."""

    @property
    def estimate(self) -> Any | None:
        """``quantlab estimate`` of the recipe's model from its config."""

    def generation(self, batch_size: int, prompt_tokens: int) -> Any:
        """The timed generation at one decode point (run once, shared by the point measurements)."""

    def served(self) -> Any | None:
        """The variant as an engine outside this process serves it, or None (measured here)."""

    def baseline_model(self) -> torch.nn.Module:
        """The recipe's baseline model (this variant's own model when it is the baseline)."""
