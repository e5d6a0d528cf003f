"""GPTQ through GPTQModel (``pip install quantlab[gptq]``), so its solver can be compared with quantlab's.

The model is saved to a scratch folder, quantized by GPTQModel on the same calibration token ids in a
process of its own (``gptqmodel_worker``: its logs, working directory and environment stay there),
written in the common GPTQ format, and read back into quantlab's QuantizedLinear layers, so both
backends are measured the same way.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field, model_validator
from torch import nn

from ...errors import UnsupportedError
from ..format import WEIGHT_FORMATS, Calibration
from ..forms.affine.gptq_layout import from_gptq_tensors
from ..io.export import untied_tensors
from ..linear import QuantizedLinear
from .gptq import GPTQSettings


def save_dense(model: nn.Module, folder: Path) -> None:
    """The model's tensors as they are now (one copy of tied ones) and its config without any quantization
    config: what GPTQModel loads. ``save_pretrained`` refuses models transformers dequantized on load (GGUF)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(untied_tensors(model.state_dict()), folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))


def _quantize_in_subprocess(folder: Path, spec: dict[str, Any]) -> None:
    """Run GPTQModel on ``spec`` with ``folder`` as its working directory; a failure is one line."""
    (folder / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "GPTQMODEL_CPU_WORKERS": os.environ.get("GPTQMODEL_CPU_WORKERS", str(max(1, torch.get_num_threads())))}
    proc = subprocess.run([sys.executable, "-m", "quantlab.quant.formats.gptqmodel_worker", str(folder / "spec.json")],
                          cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise UnsupportedError(f"GPTQModel failed (exit {proc.returncode}): {lines[-1] if lines else 'no message'}")


@WEIGHT_FORMATS.register("gptqmodel", "GPTQ by the GPTQModel library (optional extra quantlab[gptq]); fields: bits, "
                         "group_size, symmetric, act_order, damp, true_sequential, act_group_aware, kernel")
class GPTQModelFormat(GPTQSettings):
    act_group_aware: bool = Field(False, description="GPTQModel's group-aware act-order; off (the default, passed "
                                  "explicitly): the same algorithm as gptq")
    backend_tag: ClassVar[str] = "gptqmodel"
    slow_to_apply: ClassVar[bool] = True  # GPTQModel quantizes in a process of its own
    takes_transforms: ClassVar[bool] = False  # GPTQModel loads the model itself, without quantlab's transforms

    @model_validator(mode="after")
    def _group_aware_needs_groups(self) -> "GPTQModelFormat":
        if self.act_group_aware and self.group_size is None:
            raise ValueError("act_group_aware: true needs a group_size (GPTQModel refuses it per channel)")
        return self

    @property
    def scheme_label(self) -> str:
        return super().scheme_label + ("-gar" if self.act_group_aware else "")

    @property
    def recorded_settings(self) -> dict[str, Any]:
        return {**super().recorded_settings, "method": "gptqmodel", "act_group_aware": self.act_group_aware}

    def missing_dependency(self) -> str | None:
        if importlib.util.find_spec("gptqmodel") is None:
            return "weight format gptqmodel needs GPTQModel: pip install 'quantlab[gptq]'"
        return super().missing_dependency()

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        missing = self.missing_dependency()
        if missing:
            raise UnsupportedError(missing)
        from safetensors.torch import load_file

        if calibration is None or calibration.tokenizer is None:
            raise UnsupportedError("the gptqmodel backend needs calibration data with its tokenizer (not a synthetic model)")
        if self.per_tensor or self.clip != "none" or self.bits not in (2, 4, 8):
            raise UnsupportedError("gptqmodel backend: bits 2, 4 or 8, per channel or grouped, no clip search")
        device = next(model.parameters()).device
        with tempfile.TemporaryDirectory(prefix="quantlab-gptqmodel-") as tmp:
            src, out = Path(tmp) / "src", Path(tmp) / "out"
            save_dense(model, src)
            calibration.tokenizer.save_pretrained(src)
            config = {"bits": self.bits, "group_size": self.group_size or -1, "desc_act": self.act_order,
                      "sym": self.symmetric, "damp_percent": self.damp, "true_sequential": self.true_sequential,
                      "act_group_aware": self.act_group_aware,
                      "device": "cpu" if device.type == "cpu" else None, "offload_to_disk": False}
            samples = [{"input_ids": ids[0].tolist(), "attention_mask": [1] * ids.shape[1]} for ids in calibration]
            _quantize_in_subprocess(Path(tmp), {"src": str(src), "out": str(out), "config": config, "samples": samples})
            tensors = load_file(out / "model.safetensors")
            checkpoint_format = json.loads((out / "quantize_config.json").read_text()).get("checkpoint_format", "gptq")
        details: dict[str, Any] = {}
        for name in selected:
            if f"{name}.qweight" not in tensors:
                continue
            part = {k: tensors[f"{name}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")}
            q = from_gptq_tensors(part, self.bits, self.group_size or -1, self.symmetric, checkpoint_format)
            model.set_submodule(name, QuantizedLinear.from_linear(model.get_submodule(name), q.to(device), self.kernels,
                                                                  self.recorded_settings))
            details[name] = {"backend": "gptqmodel"}
        if not details:
            raise UnsupportedError("GPTQModel quantized none of the selected modules")
        return details
