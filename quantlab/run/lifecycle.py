"""A variant's lifecycle: its model loaded and quantized (or its calibrated weights reused from the run folder),
served by its engine, one generation per decode point; what the measurements read through ``MeasureContext``."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..data import load_text
from ..engine import DecodeResult, engine
from ..engine.memory import rss_bytes
from ..errors import QuantlabError, first_line
from ..estimate.model import config_estimate
from ..models import (
    LoadedModel,
    load_model,
    load_tokenizer,
    model_location,
)
from ..progress import stage
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


def load_baseline(recipe: Any, device: torch.device) -> tuple[LoadedModel, QuantizeReport]:
    """The recipe's baseline variant in this process: its model loaded and its weight format applied."""
    weight = recipe.baseline_variant.weight
    with stage(f"loading the baseline ({weight.label}) for its distributions"):
        loaded = load_model(recipe.model, device, recipe.seed)
        report = quantize_(loaded.model, weight, calibration_for(recipe, loaded) if weight.needs_calibration else None)
    return loaded, report


def load_unquantized_baseline(recipe: Any, purpose: str) -> tuple[LoadedModel, Calibration]:
    """The recipe's baseline loaded and its calibration windows, refused in one line when the baseline quantizes
    linears (``purpose``: what needs it unquantized, e.g. "sensitivity needs")."""
    from ..engine.device import resolve_device

    loaded, applied = load_baseline(recipe, resolve_device(recipe.device))
    if applied.replaced:
        raise QuantlabError(f"{recipe.source}: the baseline {recipe.baseline_variant.weight.label} quantizes linears; "
                            f"{purpose} an unquantized baseline (fp32, bf16 or fp16)")
    return loaded, calibration_for(recipe, loaded)


SHARED_WEIGHTS = "weights"  # run-folder subfolder: calibrated weight formats, solved once for all their variants


def shared_weights_path(recipe: Any, variant: Any, device: torch.device, run_folder: Path | None) -> Path | None:
    """Where the quantized model of ``variant``'s weight format is kept for the run's other variants that take
    the same format (its other KV formats): only for formats that calibrate (a solve is never repeated), and
    not for models placed across devices by accelerate. None: quantize in place, keep nothing."""
    weight = variant.weight
    if run_folder is None or not weight.needs_calibration or recipe.model.device_map:
        return None
    if sum(v.weight == weight for v in recipe.variants()) < 2:
        return None
    from ..quant.format import format_entry

    key = json.dumps({"model": recipe.model.model_dump(mode="json"), "weight": format_entry(weight),
                      "calibration": recipe.calibration.model_dump(mode="json"), "seed": recipe.seed,
                      "device": device.type}, sort_keys=True)
    return run_folder / SHARED_WEIGHTS / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


def save_shared_weights(path: Path, model: torch.nn.Module, report: QuantizeReport, quantize_s: float,
                        variant: str) -> bool:
    """Keep a quantized model for the run's other variants (atomically); False when the model cannot be saved
    (then each variant quantizes its own)."""
    from ..files import atomic_write

    try:
        atomic_write(path, lambda tmp: torch.save({"model": model, "report": report, "quantize_s": quantize_s,
                                                   "variant": variant}, tmp))
        return True
    except Exception as e:  # noqa: BLE001 - e.g. a kernel holding something that does not pickle
        print(f"quantized weights not kept for reuse ({type(e).__name__}: {first_line(e)})", file=sys.stderr)
        return False


def load_shared_weights(path: Path, device: torch.device) -> dict[str, Any] | None:
    """A quantized model an earlier variant of this run kept, or None (absent, or unreadable: quantize again)."""
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location=device, weights_only=False)  # written by this run folder's own runs
    except Exception as e:  # noqa: BLE001
        print(f"{path}: kept weights unreadable, quantizing again ({type(e).__name__}: {first_line(e)})",
              file=sys.stderr)
        return None


def _relative(path: Path, folder: Path | None) -> str:
    return str(path.relative_to(folder)) if folder is not None else str(path)


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
    weights_source: dict[str, Any] = field(default_factory=dict)  # quantized here, or reused from the run folder
    _generations: dict[tuple[int, int], DecodeResult] = field(default_factory=dict)
    _served: Any = None  # engine: llama.cpp: the variant's file held by llama.cpp (LlamaCppVariant)

    @property
    def model(self) -> torch.nn.Module:
        assert self.loaded is not None, "load_and_quantize() first"
        return self.loaded.model

    def load_and_quantize(self) -> None:
        self.rss_before_load_bytes = rss_bytes()
        start = time.perf_counter()
        path = shared_weights_path(self.recipe, self.variant, self.device, self.run_folder)
        saved = load_shared_weights(path, self.device) if path is not None else None
        if saved is not None:  # another variant of this run solved the same weight format: reuse it, no base load
            spec = self.recipe.model
            self.loaded = LoadedModel(saved["model"], load_tokenizer(spec), model_location(spec))
            self.quantize_report = saved["report"]
            self.quantize_s = round(time.perf_counter() - start, 3)
            self.weights_source = {"reused": _relative(path, self.run_folder), "quantize_s": saved["quantize_s"],
                                   "by_variant": saved["variant"]}
            self.calibrate_kv()
            return
        with stage(f"loading the model ({self.recipe.model.label})"):
            self.loaded = load_model(self.recipe.model, self.device, self.recipe.seed)
        weight = self.variant.weight
        calibration = calibration_for(self.recipe, self.loaded) if weight.needs_calibration else None
        with stage(f"quantizing as {weight.label}"):
            self.quantize_report = quantize_(self.loaded.model, weight, calibration)
        self.quantize_s = round(time.perf_counter() - start, 3)
        self.weights_source = {"quantized": "here"}
        if path is not None and save_shared_weights(path, self.loaded.model, self.quantize_report, self.quantize_s,
                                                    self.variant.label):
            self.weights_source["saved"] = _relative(path, self.run_folder)
        self.calibrate_kv()

    def calibrate_kv(self) -> None:
        """Give a KV format that keeps static scales its figures, from this variant's own model run on the
        recipe's calibration text (the variant's KV format is replaced by the calibrated one)."""
        kv = self.variant.kv
        if not kv.calibrates:
            return
        with stage(f"calibrating the {kv.label} KV cache"):
            samples = calibration_for(self.recipe, self.loaded).samples
            calibrated = kv.calibrated(self.model, samples, self.recipe.calibration.text)
        self.variant = dataclasses.replace(self.variant, kv=calibrated)

    def _workload(self, batch_size: int, prompt_tokens: int) -> dict[str, Any]:
        w = self.recipe.workload
        return dict(batch_size=batch_size, prompt_tokens=prompt_tokens, new_tokens=w.new_tokens,
                    warmup_runs=w.warmup_runs, prefill_repeats=w.prefill_repeats, seed=self.recipe.seed)

    def generation(self, batch_size: int, prompt_tokens: int) -> DecodeResult:
        """The timed generation at one (batch, prompt) point, run once and shared by the point measurements."""
        key = (batch_size, prompt_tokens)
        if key not in self._generations:
            kwargs = self._workload(batch_size, prompt_tokens)
            served = self.served()
            self._generations[key] = (served.decode(self.model.config, **kwargs) if served is not None else
                                      engine(self.variant.engine).decode(self.model, self.variant.kv, self.device,
                                                                         **kwargs))
        return self._generations[key]

    @contextlib.contextmanager
    def decode_rounds(self, batch_size: int, prompt_tokens: int) -> Iterator[Callable[[], DecodeResult]]:
        """The variant's engine made ready at one point for rounds of timing between other variants' (each call
        of what this yields times one generation); ``set_generation`` then gives the point its pooled result."""
        kwargs = self._workload(batch_size, prompt_tokens)
        served = self.served()
        if served is not None:  # an engine outside this process: each round a whole decode of its own
            yield lambda: served.decode(self.model.config, **kwargs)
            return
        with engine(self.variant.engine).decode_rounds(self.model, self.variant.kv, self.device, **kwargs) as timed:
            yield timed

    def set_generation(self, batch_size: int, prompt_tokens: int, result: DecodeResult) -> None:
        """The point's timed generation, measured elsewhere (pooled rounds): what the point measurements read."""
        self._generations[(batch_size, prompt_tokens)] = result

    def served(self) -> Any | None:
        """The variant as an engine outside this process serves it (e.g. ``llama.cpp``: its GGUF export held by
        llama.cpp, started on first use), or None: an engine of this process measures the model here."""
        chosen = engine(self.variant.engine)
        if chosen.in_process:
            return None
        if self._served is None:
            self._served = chosen.serve(self)
        return self._served

    @property
    def scoring_model(self) -> Any:
        """What the quality evaluations run: the model, or llama.cpp's logits for the variant's file."""
        served = self.served()
        return self.model if served is None else served.lm

    def close(self) -> None:
        """End what the measurements started outside this process (an engine's child)."""
        if self._served is not None:
            self._served.close()
            self._served = None

    @property
    def estimate(self) -> Any | None:
        return config_estimate(self.recipe.model)

    @property
    def tokenizer(self) -> Any | None:
        assert self.loaded is not None, "load_and_quantize() first"
        return self.loaded.tokenizer

    def baseline_model(self) -> torch.nn.Module:
        """The recipe's baseline model: this variant's, or the baseline loaded and quantized here."""
        if self.variant.label == self.recipe.baseline_label:
            return self.model
        return load_baseline(self.recipe, self.device)[0].model
