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
from ..codecs.integer import as_integer
from ..forms.affine.awq_layout import pack_awq
from ..forms.affine.codecs import scale_cast_deviation
from .export import EXPORTERS, Exporter, ExportResult, LinearWeight, other_tensors, write_checkpoint


@EXPORTERS.register("awq", "an AutoAWQ GEMM checkpoint folder (qweight/qzeros/scales) for transformers and vLLM, from "
                    "4-bit integer codes in groups that divide the input")
class AWQExporter(Exporter):
    name = "awq"
    one_setting = True
    nearest = "format: int4 (or awq, gptq) with group_size 32, 64 or 128 dividing the input"

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        result = ExportResult("awq", folder, [])
        integers = {lw.name: as_integer("awq", lw.stored) for lw in linears}
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
