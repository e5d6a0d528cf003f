"""Published quantized checkpoints as a weight format: ``{format: checkpoint, path: FOLDER}``.

The recipe's model gives the architecture (and the tensors a checkpoint leaves out); the folder's quantized
linears replace its layers as ``QuantizedLinear`` and its other tensors (norms, embeddings, which AWQ may have
rescaled) replace the model's. Readable:

- GPTQ, ``checkpoint_format`` ``gptq`` (v1) or ``gptq_v2``, bits 2/4/8, act-order included (``gptq_checkpoint``);
- AWQ, ``version: gemm`` (AutoAWQ's default): ``qweight`` int32 ``[in, out * bits / 32]`` packing 8 output
  columns per word in the order 0 2 4 6 1 3 5 7, ``qzeros`` likewise per group, ``scales`` ``[groups, out]``,
  dequantized as ``(q - zero) · scale``;
- a GGUF file (``path: model.gguf``, a llama.cpp k-quant or legacy type as downloaded): each linear keeps the
  file's ggml blocks (``io/gguf_read.py``), the output head included (a tied one: the embedding's blocks, as
  llama.cpp multiplies it); the file's other tensors, dequantized, replace the model's.

For a folder, the quantization settings come from ``quantize_config.json`` / ``quant_config.json`` or the ``quantization_config``
of ``config.json``; the tensors from every ``*.safetensors`` file in the folder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field, field_validator
from torch import nn

from ...errors import UnsupportedError
from ..format import WEIGHT_FORMATS, Calibration, WeightFormat
from ..forms.affine.awq_layout import from_awq_tensors
from ..forms.affine.gptq_layout import FORMATS as GPTQ_FORMATS
from ..forms.affine.gptq_layout import from_gptq_tensors
from ..forms.affine.tensor import QuantizedTensor
from ..forms.ggml.tensor import GGMLBlockTensor
from ..kernels.base import KernelName, choose_kernel
from ..linear import QuantizedLinear, linear_types, linear_weight
from ..tensors.base import Spec


@dataclass(frozen=True)
class CheckpointSettings:
    """What a quantized checkpoint's config says of its layout."""

    method: str  # gptq | awq
    bits: int
    group_size: int | None
    symmetric: bool
    layout: str  # gptq, gptq_v2 or gemm

    @classmethod
    def read(cls, folder: Path) -> "CheckpointSettings":
        config: dict[str, Any] = {}
        for name in ("quantize_config.json", "quant_config.json"):
            if (folder / name).is_file():
                config = json.loads((folder / name).read_text())
                break
        else:
            if (folder / "config.json").is_file():
                config = json.loads((folder / "config.json").read_text()).get("quantization_config") or {}
        if not config:
            raise UnsupportedError(f"{folder}: no quantize_config.json, quant_config.json or config.json "
                                   "quantization_config: not a quantized checkpoint")
        method = str(config.get("quant_method", "awq" if "w_bit" in config or "version" in config else "gptq")).lower()
        bits = int(config.get("bits", config.get("w_bit", 0)))
        group = int(config.get("group_size", config.get("q_group_size", -1)))
        group_size = None if group == -1 else group
        if method == "gptq":
            layout = config.get("checkpoint_format", "gptq")
            if layout not in GPTQ_FORMATS or bits not in (2, 4, 8):
                raise UnsupportedError(f"{folder}: GPTQ checkpoint_format {layout!r} with bits {bits} is not read "
                                       f"(readable: {', '.join(GPTQ_FORMATS)}, bits 2/4/8)")
            return cls("gptq", bits, group_size, bool(config.get("sym", True)), layout)
        if method == "awq":
            version = str(config.get("version", "gemm")).lower()
            if version != "gemm" or bits != 4:
                raise UnsupportedError(f"{folder}: AWQ version {version!r} with bits {bits} is not read "
                                       "(readable: gemm, 4 bits)")
            return cls("awq", bits, group_size, not config.get("zero_point", True), "gemm")
        raise UnsupportedError(f"{folder}: quant_method {method!r} is not read (readable: gptq, awq)")

    @property
    def label(self) -> str:
        return f"{self.method}{self.bits}-{'pc' if self.group_size is None else f'g{self.group_size}'}"


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedError(f"{folder}: no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(f))
    return tensors


def quantized_tensor(settings: CheckpointSettings, part: dict[str, torch.Tensor]) -> QuantizedTensor:
    if settings.method == "awq":
        return from_awq_tensors(part, settings.bits, settings.group_size)
    return from_gptq_tensors(part, settings.bits, settings.group_size or -1, settings.symmetric, settings.layout)


@WEIGHT_FORMATS.register("checkpoint", "a published GPTQ (v1/v2) or AWQ (gemm) checkpoint folder, or a GGUF file "
                         "(its ggml blocks kept), loaded into the recipe model's layers; fields: path, kernel")
class CheckpointFormat(WeightFormat):
    takes_transforms: ClassVar[bool] = False  # its weights were rounded elsewhere
    example_fields: ClassVar[dict[str, Any] | None] = None  # a published folder: tests/quant/formats/test_checkpoint.py
    path: str = Field(description="folder of the quantized checkpoint, or a .gguf file (relative paths: to the "
                      "recipe)")
    kernel: KernelName = Field("auto", description="matmul path; auto takes the fastest that supports the tensor")

    @field_validator("path")
    @classmethod
    def _readable(cls, path: str) -> str:
        if is_gguf(path):
            with open(path, "rb") as f:
                if f.read(4) != b"GGUF":
                    raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
            return path
        try:  # a folder that is not a readable checkpoint is a config error
            CheckpointSettings.read(Path(path))
        except UnsupportedError as e:
            raise ValueError(str(e)) from None
        return path

    @property
    def settings(self) -> CheckpointSettings:
        return CheckpointSettings.read(Path(self.path))

    @property
    def scheme_label(self) -> str:
        if is_gguf(self.path):
            return f"ckpt-gguf-{Path(self.path).stem}"
        return f"ckpt-{self.settings.label}-{Path(self.path).name}"

    def stored_specs(self) -> tuple[Spec, ...]:
        return (Spec("ggml"),) if is_gguf(self.path) else ()  # a GGUF's blocks are written back as they were read

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        if is_gguf(self.path):
            raise NotImplementedError("a GGUF file gives each tensor its own type (linear_weights_bytes reads them)")
        s = self.settings
        return QuantizedTensor.analytic_nbytes((out_features, in_features), s.bits, s.group_size, s.symmetric, 2)

    def linear_weights_bytes(self, linears: dict[str, tuple[int, int]], base: torch.dtype) -> int:
        if not is_gguf(self.path):
            return super().linear_weights_bytes(linears, base)
        from ..io.gguf_read import BLOCK_TYPES, GGUFTensors

        head = next((n for n in linears if n.rsplit(".", 1)[-1] == "lm_head"), None)
        types = GGUFTensors.read(Path(self.path)).linear_types(linears, head)
        return sum(GGMLBlockTensor.analytic_nbytes(shape, types[n]) if types[n] in BLOCK_TYPES
                   else shape[0] * shape[1] * base.itemsize for n, shape in linears.items())

    @torch.no_grad()
    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        """Every quantized linear of the checkpoint replaces the model's (whatever ``selected`` says: the
        checkpoint decided), then its other tensors replace the model's."""
        if is_gguf(self.path):
            return self._apply_gguf(model)
        folder, settings = Path(self.path), self.settings
        tensors = read_tensors(folder)
        names = sorted({k[: -len(".qweight")] for k in tensors if k.endswith(".qweight")})
        if not names:
            raise UnsupportedError(f"{folder}: no quantized tensors (*.qweight)")
        details: dict[str, Any] = {}
        for name in names:
            try:
                old = model.get_submodule(name)
            except AttributeError:
                raise UnsupportedError(f"{folder}: {name} is not a module of the recipe's model") from None
            keys = ("qweight", "qzeros", "scales") + (("g_idx",) if settings.method == "gptq" else ())
            q = quantized_tensor(settings, {k: tensors.pop(f"{name}.{k}") for k in keys if f"{name}.{k}" in tensors})
            shape = tuple(linear_weight(old).shape) if isinstance(old, linear_types()) else None
            if q.shape != shape:
                raise UnsupportedError(f"{folder}: {name} is {list(q.shape)} in the checkpoint, {shape} in the model")
            weight = linear_weight(old)
            q = q.to(weight.device)
            bias = tensors.pop(f"{name}.bias", None)
            new = QuantizedLinear(choose_kernel(q, weight.device, weight.dtype, None if self.kernel == "auto" else [self.kernel]),
                                  None if bias is None else bias.to(weight.device, weight.dtype), q.describe(),
                                  {"method": settings.method, "checkpoint": str(folder)})
            model.set_submodule(name, new)
            details[name] = {"checkpoint_layout": settings.layout}
        state = model.state_dict()
        for key, value in tensors.items():
            if key not in state:
                continue  # e.g. a tied head written twice
            if value.shape != state[key].shape:
                raise UnsupportedError(f"{folder}: {key} is {list(value.shape)} in the checkpoint, "
                                       f"{list(state[key].shape)} in the model")
            state[key].copy_(value.to(state[key].dtype))
        return details

    def _apply_gguf(self, model: nn.Module) -> dict[str, Any]:
        from ..apply import default_exclude
        from ..io.gguf_read import BLOCK_TYPES, TIED_HEAD_SOURCE, GGUFTensors, check_architecture

        found = GGUFTensors.read(Path(self.path))
        check_architecture(found, model)
        config, heads = model.config, default_exclude(model)
        linears = [n for n, m in model.named_modules() if isinstance(m, linear_types())]
        stems = found.names_for([n for n, _ in model.named_modules()])
        details: dict[str, Any] = {}
        done: set[str] = set()
        for name in linears:
            old = model.get_submodule(name)
            weight = linear_weight(old)
            key = found.tensor_for(name, stems.get(name), name in heads)
            done.add(f"{name}.weight")
            details[name] = {"ggml_type": found.type_of(key), "gguf_tensor": key}
            if found.type_of(key) not in BLOCK_TYPES:
                weight.data.copy_(found.dense(key, name, config).to(weight.dtype))
                continue
            q = found.blocks(key, tuple(weight.shape), name, config).to(weight.device)
            kernels = None if self.kernel == "auto" else [self.kernel]
            bias = getattr(old, "bias", None)
            model.set_submodule(name, QuantizedLinear(
                choose_kernel(q, weight.device, weight.dtype, kernels), None if bias is None else bias.data.clone(),
                q.describe(), {"method": "gguf", "ggml_type": q.ggml_type, "checkpoint": self.path}))
        head_on_table = any(d["gguf_tensor"] == TIED_HEAD_SOURCE for d in details.values())
        self._gguf_embedding(model, found, stems, details, head_on_table)
        for key, param in model.state_dict().items():
            stem, suffix = key.rsplit(".", 1)
            tensor = f"{stems.get(stem)}.{suffix}"
            if key in done or tensor not in found.tensors:
                continue
            value = found.dense(tensor, stem, config)
            if value.shape != param.shape:
                raise UnsupportedError(f"{self.path}: {tensor} is {list(value.shape)}, the model's {key} "
                                       f"{list(param.shape)}")
            param.copy_(value.to(param.dtype))
        return details

    @staticmethod
    def _gguf_embedding(model: nn.Module, found: Any, stems: dict[str, str], details: dict[str, Any],
                        head_on_table: bool) -> None:
        """A token embedding the file holds in a block type stays in it: shared with the head when the head is
        that very tensor (``head_on_table``: a tied model), else its own blocks (``BlockEmbedding``)."""
        from ..embedding import block_embedding_
        from ..io.gguf_read import BLOCK_TYPES

        table = model.get_input_embeddings()
        name = next((n for n, m in model.named_modules() if m is table), None)
        key = f"{stems.get(name or '')}.weight"
        if name is None or key not in found.tensors or found.type_of(key) not in BLOCK_TYPES:
            return
        new = block_embedding_(model) if head_on_table else None
        if new is None:
            new = block_embedding_(model, found.blocks(key, tuple(table.weight.shape), name, model.config))
        details[name] = {"ggml_type": new.ggml_type, "gguf_tensor": key, **({"tied_to_head": True} if new.tied else {})}


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")
