"""ggml's block types as a weight format: ``{format: gguf, type: Q4_K}``, quantized by ggml's own code.

Each selected linear is stored in the asked type, or in the type llama.cpp's quantizer substitutes where its
rows are not whole blocks of it (``tensors/ggml_blocks.row_type``: Q4_K → Q5_0 for a row of 576, SmolLM2's
hidden size), so the bytes are those of the GGUF file llama.cpp would write, and the model exports to that
file as it was measured. ``imatrix: true`` takes an importance matrix from the recipe's calibration (the
unquantized model's mean squared input per column, as ``llama-imatrix`` computes it) and quantizes with it, as
``llama-quantize --imatrix`` does.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from ..calibrate.imatrix import collect_imatrix
from ..format import WEIGHT_FORMATS, Calibration, QuantizedWeightFormat
from ..kernels.ggml import quantize_ggml
from ..linear import QuantizedLinear, linear_weight
from ..tensors.ggml_blocks import GGML_TYPES, GGMLBlockTensor, row_type

GGMLTypeName = Literal["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
                       "IQ4_XS"]


class GGUFFormat(QuantizedWeightFormat):
    """Linear weights in one ggml block type (llama.cpp's substitute where a row is not whole blocks of it)."""

    example_fields: ClassVar[dict[str, Any] | None] = {"type": "Q4_K"}
    type: GGMLTypeName = Field(description="the ggml block type: Q2_K … Q6_K (super-blocks of 256), Q4_0, Q4_1, "
                               "Q5_0, Q5_1, Q8_0 (blocks of 32), IQ4_NL, IQ4_XS (a non-linear 4-bit table)")
    imatrix: bool = Field(False, description="weigh the rounding by an importance matrix from the recipe's "
                          "calibration (llama-imatrix's per-column mean squared activation)")
    kernel: Literal["auto", "ggml_cpu", "dequantize+matmul"] = Field(
        "auto", description="auto: ggml_cpu on CPU (the blocks multiplied as stored), else dequantize+matmul")

    @property
    def needs_calibration(self) -> bool:
        return self.imatrix or any(o.format.requires_calibration for o in self.overrides)

    @property
    def calibrates_head(self) -> bool:
        return self.imatrix

    @property
    def scheme_label(self) -> str:
        parts = ["gguf", self.type.lower()] + (["imat"] if self.imatrix else [])
        return "-".join(parts + self.compute_dtype_label() + ([self.kernel] if self.kernel != "auto" else []))

    @property
    def exports(self) -> tuple[str, ...]:
        return ("gguf",)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return GGMLBlockTensor.analytic_nbytes((out_features, in_features), row_type(self.type, in_features))

    def stored_type(self, in_features: int) -> str:
        """The ggml type a linear of ``in_features`` inputs is stored in."""
        return row_type(self.type, in_features)

    def _quantized(self, module: nn.Module, imatrix: torch.Tensor | None) -> QuantizedLinear:
        weight = linear_weight(module)
        kind = self.stored_type(weight.shape[1])
        q = quantize_ggml(weight, kind, imatrix)
        kernels = None if self.kernel == "auto" else [self.kernel]
        settings = {"method": "gguf", "ggml_type": kind, **({"asked": self.type} if kind != self.type else {}),
                    "imatrix": imatrix is not None}
        return QuantizedLinear.from_linear(module, q, kernels, settings)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        return self._quantized(module, None)

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        """Quantize ``selected`` in place; with ``imatrix``, after one forward over the calibration that gives
        every selected linear its importance matrix (modules an override stores otherwise are already in theirs)."""
        from ..offload import onloaded, placed

        sums = collect_imatrix(model, selected, calibration or []) if self.imatrix else {}
        details: dict[str, Any] = {}
        for name in selected:
            old = model.get_submodule(name)
            with onloaded(old):
                new = self._quantized(old, sums[name].mean() if name in sums else None)
            model.set_submodule(name, placed(new, old))
            details[name] = {"ggml_type": new.settings["ggml_type"],
                             **({"imatrix_tokens": sums[name].rows} if name in sums else {})}
        return details


WEIGHT_FORMATS.register("gguf", "ggml block types as llama.cpp writes them (ggml's own quantizer); fields: type "
                        "(Q2_K … Q6_K, Q4_0 … Q8_0, IQ4_NL, IQ4_XS), imatrix, compute_dtype, kernel")(GGUFFormat)

assert set(GGMLTypeName.__args__) <= set(GGML_TYPES)  # type: ignore[attr-defined]
