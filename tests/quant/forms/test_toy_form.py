"""A new stored form is a tensor class, a kernel, a format and a codec, each with one registration, written here
from outside the package through ``quantlab.extend``: the format quantizes the bundled model into the form, ``auto``
picks its kernel, its ``exports`` comes from its codec, and transformers loads the compressed-tensors folder to the
measured logits."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

from quantlab import export_, quantize_
from quantlab.extend import (
    CODECS,
    KERNELS,
    WEIGHT_FORMATS,
    CompressedTensorsCodec,
    Kernel,
    QuantizedWeightFormat,
    Spec,
    WeightTensor,
    register_codec,
)
from quantlab.models import bundled_models
from quantlab.quant.linear import QuantizedLinear, linear_weight

pytest.importorskip("compressed_tensors")


@dataclass
class RowInt8(WeightTensor):
    """Symmetric int8 codes with one float32 scale per row."""

    codes: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # float32 [out, 1]
    shape: tuple[int, int]

    form = "toy-row-int8"

    @classmethod
    def tensor_field_names(cls) -> tuple[str, ...]:
        return ("codes", "scales")

    def layout_nbytes(self) -> int:
        return self.shape[0] * self.shape[1] + 4 * self.shape[0]

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        rows = slice(None) if rows is None else rows
        return (self.codes[rows].float() * self.scales[rows]).to(dtype)


class RowInt8Kernel(Kernel):
    path = "toy_row_int8"
    preference = 5
    tensor_type = RowInt8
    used = 0

    def __init__(self, q: RowInt8, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape = q.shape
        self.register_buffer("codes", q.codes)
        self.register_buffer("scales", q.scales)

    @classmethod
    def supports(cls, q: WeightTensor, device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        RowInt8Kernel.used += 1
        return (F.linear(x.float(), self.codes.float()) * self.scales[:, 0]).to(x.dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.stored().dequantize(dtype)

    def stored(self) -> WeightTensor:
        return RowInt8(self.codes, self.scales, self.shape)

    def analytic_nbytes(self) -> int:
        return self.stored().layout_nbytes()


class RowInt8Format(QuantizedWeightFormat):
    example_fields: ClassVar[dict[str, Any] | None] = {}

    @property
    def scheme_label(self) -> str:
        return "toy-row-int8"

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("toy-row-int8"),)

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        return out_features * in_features + 4 * out_features

    def quantize_module(self, name: str, module: torch.nn.Module) -> torch.nn.Module:
        w = linear_weight(module).float()
        scales = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
        q = RowInt8(torch.round(w / scales).clamp(-127, 127).to(torch.int8), scales, tuple(w.shape))
        return QuantizedLinear.from_linear(module, q)


class RowInt8CompressedTensors(CompressedTensorsCodec):
    """compressed-tensors' int8 channel scheme, packed as pack-quantized."""

    def scheme(self, q: WeightTensor) -> dict[str, Any]:
        return {"format": "pack-quantized", "weights": {
            "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None,
            "dynamic": False, "actorder": None, "observer": "minmax"}}

    def tensors(self, q: WeightTensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

        assert isinstance(q, RowInt8)
        return {"weight_packed": pack_to_int32(q.codes, 8), "weight_shape": torch.tensor(list(q.shape)),
                "weight_scale": q.scales.to(dtype)}


@pytest.fixture
def toy_form():
    KERNELS.register(RowInt8Kernel)  # the registration lines
    WEIGHT_FORMATS.add("toy-row-int8", RowInt8Format, "a toy: int8 per row")
    register_codec("toy-row-int8", RowInt8CompressedTensors())
    yield
    KERNELS._kernels.pop("toy_row_int8")
    WEIGHT_FORMATS._entries.pop("toy-row-int8")
    CODECS.pop(("compressed-tensors", "toy-row-int8"))


def test_a_new_stored_form_quantizes_runs_its_kernel_and_exports_through_its_codec(toy_form, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

    src = bundled_models()["tiny-stdlib-llama"]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(src).eval(), AutoTokenizer.from_pretrained(src)
    fmt = WEIGHT_FORMATS["toy-row-int8"].build()
    assert fmt.exports == ("compressed-tensors",)  # from the codec alone
    quantize_(model, fmt)
    assert {m.kernel_path for m in model.modules() if isinstance(m, QuantizedLinear)} == {"toy_row_int8"}
    ids = tokenizer("def add(a, b):\n    return a + b\n" * 8, return_tensors="pt")["input_ids"]
    before = RowInt8Kernel.used
    with torch.no_grad():
        ref = model(ids).logits
    assert RowInt8Kernel.used > before
    export_(model, "compressed-tensors", tmp_path, tokenizer=tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=CompressedTensorsConfig(dequantize=True))
    with torch.no_grad():
        got = loaded.eval()(ids).logits
    assert ((got - ref).norm() / ref.norm()) < 1e-4
