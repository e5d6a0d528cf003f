"""ggml's block types as a weight format: ``{format: gguf, type: Q4_K}``, quantized by ggml's own code.

Each selected linear is stored in the asked type, or in the type llama.cpp's quantizer substitutes where its
rows are not whole blocks of it (``forms/ggml/tensor.row_type``: Q4_K → Q5_0 for a row of 576, SmolLM2's
hidden size), so the bytes are those of the GGUF file llama.cpp would write, and the model exports to that
file as it was measured. ``imatrix: true`` takes an importance matrix from the recipe's calibration (the
unquantized model's mean squared input per column, as ``llama-imatrix`` computes it) and quantizes with it, as
``llama-quantize --imatrix`` does; ``imatrix_path`` reads llama.cpp's imatrix file instead, or writes the collected
one there (``io/imatrix.py``).
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr, model_validator
from torch import nn

from ..calibrate.imatrix import collect_imatrix
from ..format import WEIGHT_FORMATS, Calibration, QuantizedWeightFormat
from ..forms.ggml.kernel import quantize_ggml
from ..forms.ggml.tensor import GGML_TYPES, GGMLBlockTensor, row_type
from ..linear import QuantizedLinear, linear_weight
from ..tensors.base import Spec
from .gguf_recipes import RECIPES, TensorRole, category, heads_per_kv_head, layer_of, recipe_types

GGMLTypeName = Literal["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
                       "IQ4_XS"]
RecipeName = Literal["Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0",
                     "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"]


class GGUFFormat(QuantizedWeightFormat):
    """Linear weights in one ggml block type (llama.cpp's substitute where a row is not whole blocks of it), or
    in the types one of llama.cpp's named mixes gives each (``recipe``: Q4_K_M …, the output head included)."""

    example_fields: ClassVar[dict[str, Any] | None] = {"type": "Q4_K"}
    type: GGMLTypeName | None = Field(None, description="the ggml block type: Q2_K … Q6_K (super-blocks of 256), "
                                      "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32), IQ4_NL, IQ4_XS (a non-linear "
                                      "4-bit table)")
    recipe: RecipeName | None = Field(None, description="one of llama-quantize's file types (Q4_K_M, Q3_K_M, "
                                      "Q5_K_S ...): each linear and the output head in the type its rules give")
    imatrix: bool = Field(False, description="weigh the rounding by an importance matrix from the recipe's "
                          "calibration (llama-imatrix's per-column mean squared activation)")
    imatrix_path: str | None = Field(None, description="a llama.cpp imatrix file (.gguf, or the older .dat): read "
                                     "when it exists (llama-imatrix's, or one quantlab wrote), else the one collected "
                                     "from the calibration is written there; with imatrix: true")
    kernel: Literal["auto", "ggml_repack_cpu", "ggml_q8_cpu", "ggml_cpu", "dequantize+matmul"] = Field(
        "auto", description="auto: on CPU ggml_repack_cpu for Q4_0, IQ4_NL and Q4_K (repacked at load, eight rows "
        "at a time, as llama.cpp runs them with AVX2), ggml_q8_cpu for the other types (decode rows as llama.cpp "
        "multiplies them: activations in 8-bit blocks, ggml's integer dot products; AVX2), else ggml_cpu "
        "(weight-only); elsewhere dequantize+matmul")

    _types: dict[str, str] | None = PrivateAttr(None)  # a recipe's type per module, once it has seen the model
    _observed: tuple[dict[str, torch.Tensor], dict[str, int]] | None = PrivateAttr(None)  # observe_'s importance

    @model_validator(mode="after")
    def _imatrix_path_needs_imatrix(self) -> "GGUFFormat":
        if self.imatrix_path is not None and not self.imatrix:
            raise ValueError("imatrix_path: give imatrix: true too (the file is the importance matrix it uses)")
        return self

    @model_validator(mode="after")
    def _type_or_recipe(self) -> "GGUFFormat":
        if (self.type is None) == (self.recipe is None):
            raise ValueError("gguf takes one of type (a ggml block type: " + ", ".join(GGMLTypeName.__args__)  # type: ignore[attr-defined]
                             + ") or recipe (a llama.cpp file type: " + ", ".join(RecipeName.__args__) + ")")  # type: ignore[attr-defined]
        return self

    @property
    def needs_calibration(self) -> bool:
        return self.imatrix or super().needs_calibration

    @property
    def calibrates_head(self) -> bool:
        return False  # the importance matrix is read from the unquantized model in one pass, the head's included

    @property
    def scheme_label(self) -> str:
        parts = ["gguf", (self.type or self.recipe or "").lower()] + (["imat"] if self.imatrix else [])
        return "-".join(parts + self.compute_dtype_label() + ([self.kernel] if self.kernel != "auto" else []))

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("ggml", {"ggml_type": self.type}),)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        if self.type is None:
            raise NotImplementedError("a named mix gives each tensor its type by its role and layer")
        return GGMLBlockTensor.analytic_nbytes((out_features, in_features), row_type(self.type, in_features))

    def recipe_types_for(self, linears: dict[str, tuple[int, int]], head: str | None = None) -> dict[str, str]:
        """The ggml type the recipe gives each linear (module name → ``(out, in)``; ``head``: the output head)."""
        roles = [TensorRole(n, category(n, head), layer_of(n), i) for n, (_, i) in linears.items()]
        return recipe_types(self.recipe, roles, heads_per_kv_head(linears), self.imatrix)  # type: ignore[arg-type]

    def linear_weights_bytes(self, linears: dict[str, tuple[int, int]], base: torch.dtype) -> int:
        if self.recipe is None:
            return super().linear_weights_bytes(linears, base)
        types = self.recipe_types_for(linears)
        return sum(GGMLBlockTensor.analytic_nbytes(shape, types[n]) for n, shape in linears.items())

    def prepare_model_(self, model: nn.Module) -> None:
        """A recipe's type for every linear and the output head, from their roles and layers in ``model``."""
        super().prepare_model_(model)
        if self.recipe is None:
            return
        from ..apply import default_exclude, select_linears

        heads = default_exclude(model)
        names = select_linears(model)[0] + heads
        self._types = self.recipe_types_for({n: tuple(linear_weight(model.get_submodule(n)).shape) for n in names},
                                            heads[0] if heads else None)

    def head_format(self, head: str) -> "GGUFFormat | None":
        if self.recipe is not None:
            return self.format_for(head)  # llama.cpp's mixes quantize the output matrix
        return super().head_format(head)  # type: ignore[return-value]

    @property
    def embedding_format(self) -> "GGUFFormat | None":
        """A named mix stores an untied token embedding in its default type, as llama-quantize does."""
        return None if self.recipe is None else GGUFFormat(type=RECIPES[self.recipe])

    @property
    def head_holds_lookup_table(self) -> bool:
        return True  # llama.cpp reads a tied model's token_embd for both the lookup and the output matrix

    def stored_type(self, name: str, in_features: int) -> str:
        """The ggml type the linear ``name`` of ``in_features`` inputs is stored in."""
        if self.type is not None:
            return row_type(self.type, in_features)
        if self._types is None or name not in self._types:
            raise ValueError(f"gguf recipe {self.recipe}: {name} was not among the model's linears when the mix was "
                             "chosen (quantize_ chooses it)")
        return self._types[name]

    def _quantized(self, name: str, module: nn.Module, imatrix: torch.Tensor | None) -> QuantizedLinear:
        weight = linear_weight(module)
        kind = self.stored_type(name, weight.shape[1])
        q = quantize_ggml(weight, kind, imatrix)
        kernels = None if self.kernel == "auto" else [self.kernel]
        asked = self.type or self.recipe
        settings = {"method": "gguf", "ggml_type": kind, **({"asked": asked} if kind != asked else {}),
                    "imatrix": imatrix is not None}
        return QuantizedLinear.from_linear(module, q, kernels, settings)

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module:
        return self._quantized(name, module, None)

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        """Quantize ``selected`` in place; with ``imatrix``, after one forward over the calibration that gives
        every selected linear its importance matrix (modules an override stores otherwise are already in theirs)."""
        from ..offload import onloaded, placed

        observed, self._observed = self._observed, None
        means, tokens = observed or (self._importance(model, selected, calibration) if self.imatrix else ({}, {}))
        details: dict[str, Any] = {}
        for name in selected:
            old = model.get_submodule(name)
            with onloaded(old):
                new = self._quantized(name, old, means.get(name))
            model.set_submodule(name, placed(new, old))
            details[name] = {"ggml_type": new.settings["ggml_type"],
                             **({"imatrix_tokens": tokens[name]} if name in tokens else {}),
                             **({"imatrix_file": self.imatrix_path} if name in means and self.imatrix_path else {})}
        return details

    def observe_(self, model: nn.Module, names: list[str], calibration: Calibration | None,
                 shared: dict[Any, Any]) -> None:
        """With ``imatrix``: the importance matrix of ``names`` from the model as it is now (unquantized), which
        ``apply_`` then uses; candidates of one mix reading the same ``imatrix_path`` (or none) share one collection."""
        if not self.imatrix:
            return
        key = ("imatrix", self.imatrix_path)
        if key not in shared:
            shared[key] = self._importance(model, names, calibration)
        self._observed = shared[key]

    def _importance(self, model: nn.Module, selected: list[str], calibration: Calibration | None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """Each selected module's importance matrix (and the tokens it was collected over, where it was): read
        from ``imatrix_path`` when that file exists (a module it has no entry for is quantized without one, as
        llama-quantize does), else collected from the calibration and written there."""
        from pathlib import Path

        from ..io.gguf import linear_tensor_names
        from ..io.imatrix import read_imatrix, write_imatrix

        path = Path(self.imatrix_path) if self.imatrix_path else None
        names = linear_tensor_names(model) if path is not None else {}
        if path is not None and path.is_file():
            found = read_imatrix(path)
            return {n: found[names[n]] for n in selected if names.get(n) in found}, {}
        sums = collect_imatrix(model, selected, calibration or [])
        if path is not None:
            samples = list(calibration or [])
            write_imatrix(path, {names[n]: acc for n, acc in sums.items() if n in names}, ["quantlab calibration"],
                          samples[0].shape[-1] if samples else 0)
        return {n: acc.mean() for n, acc in sums.items()}, {n: acc.rows for n, acc in sums.items()}


WEIGHT_FORMATS.register("gguf", "ggml block types as llama.cpp writes them (ggml's own quantizer); fields: type "
                        "(Q2_K … Q6_K, Q4_0 … Q8_0, IQ4_NL, IQ4_XS) | recipe (llama.cpp's named mixes: Q4_K_M ...), "
                        "imatrix, imatrix_path, compute_dtype, kernel")(GGUFFormat)

assert set(GGMLTypeName.__args__) <= set(GGML_TYPES) and set(RecipeName.__args__) == set(RECIPES)  # type: ignore[attr-defined]
