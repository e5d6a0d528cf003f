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
from ..kernels.base import DequantKernel, choose_kernel
from ..linear import QuantizedLinear
from ..tensors.affine import QuantizedTensor
from ..tensors.base import WeightTensor
from ..tensors.float_zero import FloatZeroTensor
from ..tensors.gptq_layout import EXPORT_BITS, FORMATS, from_gptq_tensors, to_gptq_tensors
from ..tensors.primitives import pack
from .export import EXPORTERS, Exporter, ExportResult, LinearWeight


def untied_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each storage once, under its first name (tied weights: the input embedding's), detached,
    contiguous and on the CPU, as safetensors writes them."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        ptr = value.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            out[key] = value.detach().cpu().contiguous()
    return out


def _quantized_layers(model: nn.Module) -> dict[str, QuantizedLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}


def integer_form(q: WeightTensor) -> QuantizedTensor | None:
    """``q`` as integer codes with integer zero points (HQQ's float zero points where every one is a whole
    number), or None when it has no such form."""
    if isinstance(q, QuantizedTensor):
        return q
    if isinstance(q, FloatZeroTensor):
        z = q.zeros.float()
        if torch.equal(z, torch.round(z)) and bool(((z >= 0) & (z < (1 << q.bits))).all()):
            return QuantizedTensor(q.packed, q.scales, pack(z.to(torch.uint8), q.bits), q.shape, q.bits, q.group_size)
    return None


def gptq_refusal(q: WeightTensor) -> str | None:
    """Why the GPTQ layout cannot hold ``q`` (naming what would), or None."""
    integer = integer_form(q)
    if integer is None:
        what = "float zero points that are not whole numbers (HQQ)" if isinstance(q, FloatZeroTensor) else \
            f"{type(q).__name__} values"
        return f"{what} have no GPTQ form; nearest that exports: format: int4 (or gptq) with integer zero points"
    if integer.bits not in EXPORT_BITS:
        return f"{integer.bits}-bit codes: the GPTQ layout is written for bits {EXPORT_BITS}"
    if integer.per_tensor:
        return "one scale per tensor: the GPTQ layout has a scale per channel or group"
    return None


def save_gptq(
    model: nn.Module, folder: str | Path, tokenizer: Any | None = None, checkpoint_format: str = "auto",
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a GPTQ checkpoint with its config (and ``tokenizer``, which loaders such as GPTQModel
    expect beside it), from the codes, scales and zero points each layer's kernel holds, whatever its layout.
    ``checkpoint_format``: ``gptq`` (v1), ``gptq_v2``, or ``auto``: v2 for asymmetric weights, v1 for symmetric
    ones (what GPTQModel loads)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    if checkpoint_format not in (*FORMATS, "auto"):
        raise UnsupportedError(f"checkpoint_format must be auto or one of {FORMATS}, got {checkpoint_format!r}")
    layers = _quantized_layers(model)
    if not layers:
        raise UnsupportedError("the model has no quantized linear layers to export")
    tensors: dict[str, torch.Tensor] = {}
    settings = set()
    for name, layer in layers.items():
        if layer.input_scale is not None:
            raise UnsupportedError(f"{name} multiplies its input by a scale (AWQ, not folded), which the GPTQ "
                                   "format cannot hold")
        try:
            stored = layer.kernel.stored()
        except UnsupportedError as e:
            raise UnsupportedError(f"{name}: {e}") from None
        problem = gptq_refusal(stored)
        if problem:
            raise UnsupportedError(f"{name}: {problem}")
        q = integer_form(stored)
        if checkpoint_format == "auto":
            checkpoint_format = "gptq" if q.symmetric else "gptq_v2"
        settings.add((q.bits, q.group_size or -1, q.symmetric, q.g_idx is not None,
                      bool(layer.settings.get("true_sequential", False))))
        tensors.update({f"{name}.{k}": v.cpu() for k, v in to_gptq_tensors(q, checkpoint_format).items()})
        if layer.bias is not None:
            tensors[f"{name}.bias"] = layer.bias.data.to(torch.float16).cpu()
    if len(settings) != 1:
        raise UnsupportedError(f"layers were quantized with different settings {sorted(settings)}; the GPTQ format "
                               "has one (a per-module mix exports to gguf)")
    bits, group_size, sym, desc_act, true_sequential = settings.pop()
    state = {k: v for k, v in model.state_dict().items() if not any(k.startswith(f"{n}.") for n in layers)}
    tensors.update(untied_tensors(state))
    qconfig = {"bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym, "static_groups": False,
               "true_sequential": true_sequential, "checkpoint_format": checkpoint_format, "quant_method": "gptq",
               "meta": {"quantizer": ["quantlab:0.1.0"]}, **(extra_config or {})}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = qconfig
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    (folder / "quantize_config.json").write_text(json.dumps(qconfig, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


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
                              None if bias is None else bias.to(device, dtype), q.bits, q.group_size,
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

    def refusal(self, module: LinearWeight) -> str | None:
        return gptq_refusal(module.stored)

    def write(self, model: nn.Module, folder: Path, tokenizer: Any | None, source: Path | None) -> ExportResult:
        save_gptq(model, folder, tokenizer)
        result = ExportResult("gptq", folder, ["model.safetensors", "config.json", "quantize_config.json"])
        for name, layer in _quantized_layers(model).items():
            q = integer_form(layer.kernel.stored())
            result.tensors[f"{name}.qweight"] = {"module": name, "type": f"gptq int{q.bits}", "max_abs_deviation":
                                                 _fp16_scale_deviation(q)}
        return result


def _fp16_scale_deviation(q: QuantizedTensor) -> float:
    """Largest change to the weight from writing the scales in float16 (0 for float16 or bf16-in-range scales)."""
    import dataclasses

    written = dataclasses.replace(q, scales=q.scales.to(torch.float16))
    return float((written.dequantize() - q.dequantize()).abs().max())
