"""What a variant's measurements share: the loaded, quantized model and one generation per decode point."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ..data import load_text
from ..engine.decode import DecodeResult, measure_decode
from ..engine.memory import rss_bytes
from ..errors import QuantlabError
from ..models import LoadedModel, load_config, load_model, model_dtype_name, model_location
from ..quant import quantize_
from ..quant.apply import QuantizeReport
from ..quant.calibrate.samples import calibration_from_text
from ..quant.format import Calibration


def calibration_for(recipe: Any, loaded: LoadedModel) -> Calibration:
    """The recipe's calibration windows, tokenized with the model's tokenizer (random tokens when synthetic)."""
    c = recipe.calibration
    if loaded.tokenizer is None:  # synthetic weights: random tokens exercise the same path
        g = torch.Generator().manual_seed(c.seed)
        return Calibration([torch.randint(0, loaded.model.config.vocab_size, (1, c.seq_len), generator=g)
                            for _ in range(c.samples)])
    return calibration_from_text(loaded.tokenizer, load_text(c.text), c.samples, c.seq_len, c.seed)


def config_estimate(model_spec: Any) -> Any | None:
    """``quantlab estimate`` of the recipe's model (from its config file where there is one, else from the
    config transformers builds), once per process; None if it cannot be made."""
    return _config_estimate(json.dumps(model_spec.model_dump(mode="json"), sort_keys=True))


def load_baseline(recipe: Any, device: torch.device) -> tuple[LoadedModel, QuantizeReport]:
    """The recipe's baseline variant in this process: its model loaded and its weight format applied."""
    loaded = load_model(recipe.model, device, recipe.seed)
    weight = recipe.baseline_variant.weight
    report = quantize_(loaded.model, weight, calibration_for(recipe, loaded) if weight.needs_calibration else None)
    return loaded, report


@lru_cache(maxsize=4)
def _config_estimate(spec_json: str) -> Any | None:
    from ..estimate import estimate_from_raw, read_raw_config
    from ..models import ModelSpec

    model_spec = ModelSpec.model_validate(json.loads(spec_json))
    config = load_config(model_spec)
    try:
        raw, where = read_raw_config(model_location(model_spec))
    except QuantlabError:
        raw, where = config.to_dict(), "the loaded config"  # e.g. a GGUF file: the config transformers built from it
    try:
        return estimate_from_raw(raw, where, [], [], seq_len=1, dtype=model_dtype_name(model_spec, config),
                                 dtype_source="the recipe's model.dtype, as loaded")
    except Exception:  # noqa: BLE001 - the record then has no estimates; the measurements are unaffected
        return None


@dataclass
class VariantContext:
    """One variant being measured in this process."""

    recipe: Any
    variant: Any
    device: torch.device
    run_folder: Path | None = None  # where run-wide intermediates live (the baseline's distributions)
    loaded: LoadedModel | None = None
    quantize_report: QuantizeReport | None = None
    quantize_s: float = 0.0
    rss_before_load_bytes: int = 0
    _generations: dict[tuple[int, int], DecodeResult] = field(default_factory=dict)

    @property
    def model(self) -> torch.nn.Module:
        assert self.loaded is not None, "load_and_quantize() first"
        return self.loaded.model

    def load_and_quantize(self) -> None:
        self.rss_before_load_bytes = rss_bytes()
        start = time.perf_counter()
        self.loaded = load_model(self.recipe.model, self.device, self.recipe.seed)
        weight = self.variant.weight
        calibration = calibration_for(self.recipe, self.loaded) if weight.needs_calibration else None
        self.quantize_report = quantize_(self.loaded.model, weight, calibration)
        self.quantize_s = round(time.perf_counter() - start, 3)

    def generation(self, batch_size: int, prompt_tokens: int) -> DecodeResult:
        """The timed generation at one (batch, prompt) point, run once and shared by the point measurements."""
        key = (batch_size, prompt_tokens)
        if key not in self._generations:
            w = self.recipe.workload
            self._generations[key] = measure_decode(
                self.model, self.variant.kv, batch_size=batch_size, prompt_tokens=prompt_tokens,
                new_tokens=w.new_tokens, warmup_runs=w.warmup_runs, prefill_repeats=w.prefill_repeats,
                seed=self.recipe.seed, device=self.device, engine=w.engine)
        return self._generations[key]

    @property
    def estimate(self) -> Any | None:
        return config_estimate(self.recipe.model)
