"""The common GPTQ checkpoint format (qweight / qzeros / scales / g_idx + quantize_config.json).

Layout, per quantized linear ``[out, in]`` with ``G`` groups:
``qweight`` int32 ``[in * bits / 32, out]`` (codes along the input, low bits first),
``qzeros`` int32 ``[G, out * bits / 32]`` holding ``zero - 1`` (``checkpoint_format: gptq``, v1, as
auto-gptq wrote it) or ``zero`` (``gptq_v2``), ``scales`` float16 ``[G, out]``, ``g_idx`` int32 ``[in]``.
v1 dequantizes as ``scales[g_idx] * (q - (qzeros[g_idx] + 1))``. Bits 2, 4 and 8 are supported.
GPTQModel loads v1 only for symmetric checkpoints from other producers (v1's ``zero - 1`` cannot hold a zero
point of 0, which some loaders' v1-to-v2 conversion turns into a carry into the next code), so ``save_gptq``
writes v2 for asymmetric weights and v1 for symmetric ones unless told otherwise; both load in GPTQModel and in
transformers' GPTQ integration.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import UnsupportedError
from ..codecs.integer import as_integer
from ..forms.affine.codecs import scale_cast_deviation
from ..forms.affine.gptq_layout import FORMATS, from_gptq_tensors, to_gptq_tensors
from ..forms.affine.tensor import QuantizedTensor
from ..kernels.base import DequantKernel, choose_kernel
from ..linear import QuantizedLinear
from .export import EXPORTERS, Exporter, ExportResult, LinearWeight, other_tensors, quantized_linears, write_checkpoint


def save_gptq(
    model: nn.Module, folder: str | Path, tokenizer: Any | None = None, checkpoint_format: str = "auto",
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a GPTQ checkpoint with its config (and ``tokenizer``, which loaders such as GPTQModel
    expect beside it), from the codes, scales and zero points each layer's kernel holds, whatever its layout.
    ``checkpoint_format``: ``gptq`` (v1), ``gptq_v2``, or ``auto``: v2 for asymmetric weights, v1 for symmetric
    ones (what GPTQModel loads)."""
    linears = quantized_linears(model)
    exporter = GPTQExporter()
    for lw in linears:
        problem = exporter.refusal(lw)
        if problem:
            raise UnsupportedError(f"{lw.name}: {problem}")
    folder = Path(folder)
    write_gptq(model, linears, folder, tokenizer, checkpoint_format, extra_config)
    return folder


def write_gptq(model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
               checkpoint_format: str = "auto", extra_config: dict[str, Any] | None = None,
               source: Path | None = None) -> tuple[dict[str, QuantizedTensor], list[str]]:
    """The GPTQ checkpoint of ``model`` from its ``linears`` (none refused by ``GPTQExporter.refusal``) into ``folder``;
    returns each linear's integer form as written, and the files written."""
    if checkpoint_format not in (*FORMATS, "auto"):
        raise UnsupportedError(f"checkpoint_format must be auto or one of {FORMATS}, got {checkpoint_format!r}")
    if not linears:
        raise UnsupportedError("the model has no quantized linear layers to export")
    tensors: dict[str, torch.Tensor] = {}
    settings = set()
    written: dict[str, QuantizedTensor] = {}
    for lw in linears:
        q = written[lw.name] = as_integer("gptq", lw.stored)
        if checkpoint_format == "auto":
            checkpoint_format = "gptq" if q.symmetric else "gptq_v2"
        settings.add((q.bits, q.group_size or -1, q.symmetric, q.g_idx is not None,
                      bool(lw.settings.get("true_sequential", False))))
        tensors.update({f"{lw.name}.{k}": v.cpu() for k, v in to_gptq_tensors(q, checkpoint_format).items()})
        if lw.bias is not None:
            tensors[f"{lw.name}.bias"] = lw.bias.to(torch.float16).cpu()
    if len(settings) != 1:
        raise UnsupportedError(f"layers were quantized with different settings {sorted(settings)}; the GPTQ format "
                               "has one (a per-module mix exports to gguf)")
    bits, group_size, sym, desc_act, true_sequential = settings.pop()
    tensors.update(other_tensors(model, linears))
    qconfig = {"bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym, "static_groups": False,
               "true_sequential": true_sequential, "checkpoint_format": checkpoint_format, "quant_method": "gptq",
               "meta": {"quantizer": ["quantlab:0.1.0"]}, **(extra_config or {})}
    folder.mkdir(parents=True, exist_ok=True)
    files = write_checkpoint(model, folder, tensors, qconfig, tokenizer, source)
    (folder / "quantize_config.json").write_text(json.dumps(qconfig, indent=2))
    return written, [*files, "quantize_config.json"]


def load_gptq(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
    kernels: list[str] | None = None,
) -> nn.Module:
    """Load a GPTQ checkpoint (v1 or v2, bits 2/4/8) into quantlab's QuantizedLinear layers.

    Unquantized tensors and activations use ``dtype``; ``kernels`` (default: dequantize+matmul,
    which keeps the checkpoint's layout) chooses the matmul path.
    """
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    qconfig = json.loads((folder / "quantize_config.json").read_text())
    checkpoint_format = qconfig.get("checkpoint_format", "gptq")
    if checkpoint_format not in FORMATS:
        raise UnsupportedError(f"{folder}: checkpoint_format {checkpoint_format!r} is not read (readable: {FORMATS})")
    config = AutoConfig.from_pretrained(folder)
    config.quantization_config = None
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tensors = load_file(folder / "model.safetensors")
    prefixes = sorted({k[: -len(".qweight")] for k in tensors if k.endswith(".qweight")})
    for name in prefixes:
        part = {k: tensors.pop(f"{name}.{k}") for k in ("qweight", "qzeros", "scales", "g_idx")}
        q = from_gptq_tensors(part, qconfig["bits"], qconfig["group_size"], qconfig["sym"], checkpoint_format)
        bias = tensors.pop(f"{name}.bias", None)
        q = q.to(device)
        new = QuantizedLinear(DequantKernel(q) if kernels is None else choose_kernel(q, torch.device(device), dtype, kernels),
                              None if bias is None else bias.to(device, dtype), q.describe(),
                              {"true_sequential": bool(qconfig.get("true_sequential", False))})
        model.set_submodule(name, new)
    model.load_state_dict({k: v.to(device, dtype) for k, v in tensors.items()}, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise UnsupportedError(f"{folder}: no tensors for {', '.join(missing[:3])}")
    return model.eval()


@EXPORTERS.register("gptq", "a GPTQ checkpoint folder (qweight/qzeros/scales/g_idx) for GPTQModel and transformers, "
                    "from integer codes of 2, 4 or 8 bits with one setting for every layer")
class GPTQExporter(Exporter):
    name = "gptq"
    one_setting = True
    nearest = "format: int4 (or gptq) with integer zero points"

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        written, files = write_gptq(model, linears, folder, tokenizer, source=source)
        result = ExportResult("gptq", folder, files)
        for name, q in written.items():
            result.tensors[f"{name}.qweight"] = {"module": name, "type": f"gptq int{q.bits}",
                                                 "max_abs_deviation": scale_cast_deviation(q, torch.float16)}
        return result
