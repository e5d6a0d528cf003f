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

from ..errors import UnsupportedError
from .kernels import DequantKernel, choose_kernel
from .linear import QuantizedLinear
from .primitives import pack
from .qtensor import QuantizedTensor

EXPORT_BITS = (2, 4, 8)


def _pack_int32(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``[rows, n]`` codes along dim 0 into int32 words of ``32 / bits`` codes, low bits first."""
    per = 32 // bits
    c = codes.to(torch.int64).reshape(codes.shape[0] // per, per, -1)
    shifts = (torch.arange(per, dtype=torch.int64) * bits).view(1, per, 1)
    words = (c << shifts).sum(dim=1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)  # same bits, signed


def _unpack_int32(words: torch.Tensor, bits: int) -> torch.Tensor:
    per = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(per, dtype=torch.int64) * bits).view(1, per, 1)
    return ((w.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1, words.shape[1]).to(torch.uint8)


FORMATS = ("gptq", "gptq_v2")


def to_gptq_tensors(q: QuantizedTensor, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """A QuantizedTensor as GPTQ tensors (``gptq``: v1, zeros stored minus one; ``gptq_v2``: as they are)."""
    if q.bits not in EXPORT_BITS:
        raise UnsupportedError(f"the GPTQ checkpoint format is written for bits {EXPORT_BITS}, not {q.bits}")
    if q.per_tensor:
        raise UnsupportedError("the GPTQ checkpoint format has no per-tensor scales")
    out, n_in = q.shape
    g_idx = q.g_idx if q.g_idx is not None else (
        torch.zeros(n_in, dtype=torch.int32) if q.group_size is None else (torch.arange(n_in) // q.group_size).to(torch.int32))
    zeros = q.row_zero_points().to(torch.int64)  # [out, G]
    v1 = checkpoint_format == "gptq"
    if v1 and (zeros == 0).any():
        raise UnsupportedError("a group has zero point 0, which GPTQ v1 (it stores zero - 1) cannot represent; "
                               "write checkpoint_format gptq_v2")
    return {
        "qweight": _pack_int32(q.codes().t().contiguous(), q.bits),
        "qzeros": _pack_int32(zeros - 1 if v1 else zeros, q.bits).t().contiguous(),
        "scales": q.scales.t().to(torch.float16).contiguous(),
        "g_idx": g_idx.to(torch.int32).cpu(),
    }


def from_gptq_tensors(
    t: dict[str, torch.Tensor], bits: int, group_size: int, sym: bool, checkpoint_format: str = "gptq"
) -> QuantizedTensor:
    """GPTQ tensors as a QuantizedTensor (``group_size = -1`` means per output channel)."""
    codes = _unpack_int32(t["qweight"], bits).t().contiguous()  # [out, in]
    out, n_in = codes.shape
    stored = _unpack_int32(t["qzeros"].t().contiguous(), bits).to(torch.int64)  # [out, G]
    zeros = (stored + 1) & ((1 << bits) - 1) if checkpoint_format == "gptq" else stored
    scales = t["scales"].t().contiguous()
    gs = None if group_size == -1 else group_size
    contiguous = torch.equal(t["g_idx"].long(), torch.zeros(n_in, dtype=torch.long) if gs is None else torch.arange(n_in) // gs)
    return QuantizedTensor(
        packed=pack(codes, bits), scales=scales, zeros=None if sym else pack(zeros.to(torch.uint8), bits),
        shape=(out, n_in), bits=bits, group_size=gs, g_idx=None if contiguous else t["g_idx"].to(torch.int32),
    )


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


def save_gptq(
    model: nn.Module, folder: str | Path, tokenizer: Any | None = None, checkpoint_format: str = "auto",
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (quantized with the dequantize+matmul kernel) as a GPTQ checkpoint with its config
    (and ``tokenizer``, which loaders such as GPTQModel expect beside it). ``checkpoint_format``: ``gptq`` (v1),
    ``gptq_v2``, or ``auto``: v2 for asymmetric weights, v1 for symmetric ones (what GPTQModel loads)."""
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
        if not isinstance(layer.kernel, DequantKernel):
            raise UnsupportedError(f"{name} uses kernel {layer.kernel_path}, whose layout is not exported; "
                                   "quantize with kernel: dequantize+matmul to export")
        if layer.input_scale is not None:
            raise UnsupportedError(f"{name} multiplies its input by a scale (AWQ, not folded), which the GPTQ "
                                   "format cannot hold")
        q = layer.kernel.qtensor
        if checkpoint_format == "auto":
            checkpoint_format = "gptq" if q.symmetric else "gptq_v2"
        settings.add((q.bits, q.group_size or -1, q.symmetric, q.g_idx is not None,
                      bool(layer.settings.get("true_sequential", False))))
        tensors.update({f"{name}.{k}": v.cpu() for k, v in to_gptq_tensors(q, checkpoint_format).items()})
        if layer.bias is not None:
            tensors[f"{name}.bias"] = layer.bias.data.to(torch.float16).cpu()
    if len(settings) != 1:
        raise UnsupportedError(f"layers were quantized with different settings {sorted(settings)}; the format has one")
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
