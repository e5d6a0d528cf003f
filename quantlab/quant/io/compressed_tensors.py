"""compressed-tensors, what llm-compressor writes and vLLM and transformers load.

Integer codes of 1–8 bits are ``pack-quantized``: ``weight_packed`` (int32, codes packed along the input by
compressed-tensors' own ``pack_to_int32``), ``weight_scale`` ``[out, groups]``, ``weight_zero_point`` (asymmetric,
packed along the output) and ``weight_shape``; float8 e4m3 values are ``float-quantized`` (``weight`` in float8 and
a float32 ``weight_scale`` per channel, tensor or 128x128 block). Stored forms outside these register a ``Codec``
(the microscaling forms: ``nvfp4-pack-quantized``, ``mxfp4-pack-quantized``, ``mxfp8-quantized``). Each distinct scheme is a config group whose targets are its
modules' names, so per-module mixes keep each module's own scheme; linears left in floating point are
``ignore``d. The numbers are those the model holds: ``(code − zero) · scale`` is compressed-tensors' own
``(q − zp) · scale`` with ``q = code − 2^(bits−1)``. Refused: NF4/FP4 codebooks, float zero points that are not
whole numbers (HQQ), act-order columns and e5m2.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ...errors import UnsupportedError
from ..linear import linear_types
from ..tensors.base import WeightTensor
from ..tensors.float8 import Float8Tensor
from .export import (
    EXPORTERS,
    Exporter,
    ExportResult,
    LinearWeight,
    integer_form,
    other_tensors,
    scale_cast_deviation,
    write_checkpoint,
)

NEAREST = "format: int4 (group_size 32-128, symmetric or not), int8, fp8 (e4m3), mxfp4, mxfp8 or nvfp4"


@dataclass(frozen=True)
class Codec:
    """How one stored form is written as compressed-tensors: its scheme (``{"format": ..., "weights": {...}}``, or
    why it has none) and its tensors by their compressed-tensors names (scales in the model's dtype where the form
    leaves that open)."""

    scheme: Callable[[WeightTensor], dict[str, Any] | str]
    tensors: Callable[[WeightTensor, torch.dtype], dict[str, torch.Tensor]]
    note: str | None = None  # what a user loading such a folder should know (written to the export's notes)


CODECS: dict[type[WeightTensor], Codec] = {}  # stored forms outside the built-in ones, by class


def register_codec(form: type[WeightTensor], codec: Codec) -> None:
    """Write ``form`` through ``codec`` (a stored form's folder registers its own)."""
    CODECS[form] = codec


def scheme(q: WeightTensor) -> dict[str, Any] | str:
    """The compressed-tensors weight arguments and format for ``q``, or why there are none."""
    if type(q) in CODECS:
        return CODECS[type(q)].scheme(q)
    if isinstance(q, Float8Tensor):
        if q.data.dtype != torch.float8_e4m3fn:
            return "float8 e5m2 values: compressed-tensors' float-quantized weights are e4m3"
        if q.block_size:
            return {"format": "float-quantized", "weights": {
                "num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "group_size": None,
                "block_structure": [q.block_size, q.block_size], "dynamic": False, "actorder": None,
                "observer": "minmax"}}
        return {"format": "float-quantized", "weights": {
            "num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor" if _per_tensor(q) else "channel",
            "group_size": None, "dynamic": False, "actorder": None, "observer": "minmax"}}
    integer = integer_form(q)
    if integer is None:
        return f"{type(q).__name__} values (not integer codes with integer zero points) have no compressed-tensors form"
    if integer.g_idx is not None:
        return "act-order columns (g_idx) are not written here (GPTQ with act_order: false exports)"
    if integer.per_tensor:
        return "one scale per tensor for integer codes is not written here"
    return {"format": "pack-quantized", "weights": {
        "num_bits": integer.bits, "type": "int", "symmetric": integer.symmetric,
        "strategy": "channel" if integer.group_size is None else "group", "group_size": integer.group_size,
        "dynamic": False, "actorder": None, "observer": "minmax"}}


def _per_tensor(q: Float8Tensor) -> bool:
    return q.scales.numel() == 1 and q.shape[0] > 1


def module_tensors(lw: LinearWeight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The module's compressed tensors by their compressed-tensors names (scales in the model's ``dtype``)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    q = lw.stored
    if type(q) in CODECS:
        return CODECS[type(q)].tensors(q, dtype)
    if isinstance(q, Float8Tensor):
        if q.block_size:
            return {"weight": q.data.cpu(), "weight_scale": q.scales.float().contiguous().cpu()}
        return {"weight": q.data.cpu(), "weight_scale": q.scales.float().reshape(1 if _per_tensor(q) else -1, 1).cpu()}
    integer = integer_form(q)
    offset = 1 << (integer.bits - 1)
    codes = (integer.codes().to(torch.int16) - offset).to(torch.int8).cpu()
    out = {"weight_packed": pack_to_int32(codes, integer.bits), "weight_shape": torch.tensor(list(integer.shape)),
           "weight_scale": integer.row_scales().to(dtype).contiguous().cpu()}
    if not integer.symmetric:
        zeros = (integer.row_zero_points().to(torch.int16) - offset).to(torch.int8).cpu()
        out["weight_zero_point"] = pack_to_int32(zeros.contiguous(), integer.bits, packed_dim=0)
    return out


def scale_deviation(q: WeightTensor, dtype: torch.dtype) -> float:
    """Largest change to the weight from writing its scales in ``dtype`` (float8 scales stay float32)."""
    return 0.0 if isinstance(q, Float8Tensor) or type(q) in CODECS else scale_cast_deviation(integer_form(q), dtype)


@EXPORTERS.register("compressed-tensors", "a compressed-tensors folder for vLLM and transformers: pack-quantized "
                    "integer codes (1-8 bits, channel or group, symmetric or not), float-quantized FP8 e4m3; mixes "
                    "as config groups")
class CompressedTensorsExporter(Exporter):
    name = "compressed-tensors"

    def check_available(self) -> None:
        try:
            import compressed_tensors  # noqa: F401
        except ImportError:
            raise UnsupportedError("exporting to compressed-tensors needs the compressed-tensors package "
                                   "(pip install 'quantlab[export]')") from None

    def refusal(self, module: LinearWeight) -> str | None:
        found = scheme(module.stored)
        return None if isinstance(found, dict) else f"{found}; nearest that exports to compressed-tensors: {NEAREST}"

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        import compressed_tensors

        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        result = ExportResult("compressed-tensors", folder, [])
        tensors: dict[str, torch.Tensor] = {}
        groups: dict[str, dict[str, Any]] = {}
        for lw in linears:
            found = scheme(lw.stored)
            groups.setdefault(json.dumps(found, sort_keys=True), {**found, "targets": []})["targets"].append(lw.name)
            tensors.update({f"{lw.name}.{k}": v for k, v in module_tensors(lw, dtype).items()})
            if lw.bias is not None:
                tensors[f"{lw.name}.bias"] = lw.bias.detach().cpu()
            result.tensors[lw.name] = {"module": lw.name, "type": f"{found['format']} {found['weights']['type']}"
                                       f"{found['weights']['num_bits']}",
                                       "max_abs_deviation": scale_deviation(lw.stored, dtype)}
        tensors.update(other_tensors(model, linears))
        quantized = {lw.name for lw in linears}
        ignore = [name for name, m in model.named_modules() if isinstance(m, linear_types()) and name not in quantized]
        formats = sorted({g["format"] for g in groups.values()})
        config_groups = {f"group_{i}": {"targets": g["targets"], "weights": g["weights"], "input_activations": None,
                                        "output_activations": None, "format": g["format"]}
                         for i, g in enumerate(groups.values())}
        qconfig = {"quant_method": "compressed-tensors", "format": formats[0] if len(formats) == 1 else "mixed-precision",
                   "quantization_status": "compressed", "config_groups": config_groups, "ignore": ignore,
                   "kv_cache_scheme": None, "version": compressed_tensors.__version__}
        result.files = write_checkpoint(model, folder, tensors, qconfig, tokenizer, source)
        result.notes += sorted({codec.note for lw in linears if (codec := CODECS.get(type(lw.stored))) and codec.note})
        if any(not g["weights"]["symmetric"] and g["format"] == "pack-quantized" for g in groups.values()):
            result.notes.append("asymmetric pack-quantized groups: transformers with compressed-tensors "
                                f"{compressed_tensors.__version__} loads them with "
                                "quantization_config=CompressedTensorsConfig(dequantize=True) (its compressed path "
                                "expects unpacked zero points, llm-compressor#1618)")
        return result
