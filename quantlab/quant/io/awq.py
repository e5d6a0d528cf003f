"""AutoAWQ's GEMM checkpoint folder, which transformers (through GPTQModel) and vLLM load.

Per quantized linear ``[out, in]`` with groups of ``g``: ``qweight`` int32 ``[in, out / 8]`` packing eight output
columns per word in the order 0 2 4 6 1 3 5 7, ``qzeros`` the same per group, ``scales`` float16 ``[in / g, out]``;
``(q − zero) · scale``. 4-bit codes only, groups dividing the input; a symmetric tensor is written with its zero
point 8 (the format always stores zeros). AWQ's scales are folded into the layer before wherever quantlab's AWQ
could fold them; a linear that still multiplies its input by one is refused, as by every target.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import UnsupportedError
from ..tensors.awq_layout import pack_awq
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


def awq_refusal(q: Any) -> str | None:
    integer = integer_form(q)
    nearest = "nearest that exports to AWQ: format: int4 (or awq, gptq) with group_size 32, 64 or 128 dividing the input"
    if integer is None or integer.bits != 4:
        return f"AWQ's GEMM layout holds 4-bit integer codes with integer zero points; {nearest}"
    if integer.group_size is None or integer.shape[1] % integer.group_size or integer.g_idx is not None:
        return f"AWQ's GEMM layout needs groups that divide the input, in order; {nearest}"
    if integer.shape[0] % 8:
        return f"AWQ packs eight output columns per word; {integer.shape[0]} outputs are not a multiple of 8"
    return None


@EXPORTERS.register("awq", "an AutoAWQ GEMM checkpoint folder (qweight/qzeros/scales) for transformers and vLLM, from "
                    "4-bit integer codes in groups that divide the input")
class AWQExporter(Exporter):
    name = "awq"
    one_setting = True

    def refusal(self, module: LinearWeight) -> str | None:
        return awq_refusal(module.stored)

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        result = ExportResult("awq", folder, [])
        integers = {lw.name: integer_form(lw.stored) for lw in linears}
        groups = {q.group_size for q in integers.values()}
        if len(groups) != 1:
            raise UnsupportedError(f"layers use groups of {sorted(groups)}; the AWQ format has one group size "
                                   "(a per-module mix exports to gguf or compressed-tensors)")
        tensors: dict[str, torch.Tensor] = {}
        for lw in linears:
            name, q = lw.name, integers[lw.name]
            tensors[f"{name}.qweight"] = pack_awq(q.codes().t().contiguous().cpu())
            tensors[f"{name}.qzeros"] = pack_awq(q.row_zero_points().t().contiguous().cpu())
            tensors[f"{name}.scales"] = q.row_scales().t().to(torch.float16).contiguous().cpu()
            if lw.bias is not None:
                tensors[f"{name}.bias"] = lw.bias.detach().to(torch.float16).cpu()
            result.tensors[name] = {"module": name, "type": "awq gemm int4",
                                    "max_abs_deviation": scale_cast_deviation(q, torch.float16)}
        tensors.update(other_tensors(model, linears))
        qconfig = {"quant_method": "awq", "bits": 4, "group_size": groups.pop(), "zero_point": True,
                   "version": "gemm", "modules_to_not_convert": None}
        result.files = [*write_checkpoint(model, folder, tensors, qconfig, tokenizer, source), "quant_config.json"]
        (folder / "quant_config.json").write_text(json.dumps({"w_bit": 4, "q_group_size": qconfig["group_size"],
                                                              "zero_point": True, "version": "GEMM"}, indent=2))
        return result
