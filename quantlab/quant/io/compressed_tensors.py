"""compressed-tensors, what llm-compressor writes and vLLM and transformers load.

Each module is written by its stored form's codec (``quant/forms/<form>/codecs.py``): integer codes as
``pack-quantized``, float8 e4m3 as ``float-quantized``, the microscaling forms as ``nvfp4-pack-quantized``,
``mxfp4-pack-quantized`` and ``mxfp8-quantized``. Each distinct scheme is a config group whose targets are its
modules' names, so per-module mixes keep each module's own scheme; linears left in floating point are
``ignore``d. The numbers are those the model holds.

A linear whose input is rotated at run time (a ``hadamard`` transform, its inverse folded into the weight) is
written as llm-compressor's QuIP modifier writes its ``v`` rotation: a ``transform_config`` scheme with an online
``input`` transform and the ``weight_input`` one already fused, and the rotation's ±1 matrix as
``<linear>.<scheme>_input.weight``, once per size (transformers' tied weights; vLLM shares one tensor per scheme
and size). Sylvester's unsigned matrices are type ``hadamard`` (vLLM applies them by its fast transform), any
other ``random-hadamard`` (applied from the matrix written).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import UnsupportedError
from ..codecs.compressed_tensors import CompressedTensorsCodec
from ..linear import linear_types
from .export import EXPORTERS, Exporter, ExportResult, LinearWeight, other_tensors, write_checkpoint


@EXPORTERS.register("compressed-tensors", "a compressed-tensors folder for vLLM and transformers: pack-quantized "
                    "integer codes (1-8 bits, channel or group, symmetric or not), float-quantized FP8 e4m3, "
                    "NVFP4/MXFP4/MXFP8; mixes as config groups")
class CompressedTensorsExporter(Exporter):
    name = "compressed-tensors"
    nearest = "format: int4 (group_size 32-128, symmetric or not), int8, fp8 (e4m3), mxfp4, mxfp8 or nvfp4"
    writes_input_rotations = True

    @classmethod
    def activations_refusal(cls, activations: Any) -> str | None:
        return input_activations(activations)[1]

    def check_available(self) -> None:
        try:
            import compressed_tensors  # noqa: F401
        except ImportError:
            raise UnsupportedError("exporting to compressed-tensors needs the compressed-tensors package "
                                   "(pip install 'quantlab[export]')") from None

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        import compressed_tensors

        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        result = ExportResult("compressed-tensors", folder, [])
        tensors: dict[str, torch.Tensor] = {}
        groups: dict[str, dict[str, Any]] = {}
        notes: set[str] = set()
        for lw in linears:
            codec = self.codec(lw.stored)
            assert isinstance(codec, CompressedTensorsCodec)
            found = {**codec.scheme(lw.stored),
                     "input_activations": None if lw.activations is None else input_activations(lw.activations)[0]}
            groups.setdefault(json.dumps(found, sort_keys=True), {**found, "targets": []})["targets"].append(lw.name)
            tensors.update({f"{lw.name}.{k}": v for k, v in codec.tensors(lw.stored, dtype).items()})
            if lw.bias is not None:
                tensors[f"{lw.name}.bias"] = lw.bias.detach().cpu()
            if lw.input_global_scale is not None:  # the static scale its input is rounded under
                tensors.update(static_input_tensors(lw.name, lw.activations.format, lw.input_global_scale))
            if lw.activations is not None and lw.activations.format == "int8" and not lw.activations.static \
                    and lw.activations.scale_divisor != 127.5:
                notes.add("int8 activations were measured with vLLM's per-token scale (max |x| / 127); "
                          "compressed-tensors' forward in transformers takes max |x| / 127.5 (scale_divisor: 127.5 "
                          "measures that)")
            result.tensors[lw.name] = {"module": lw.name, "type": f"{found['format']} {found['weights']['type']}"
                                       f"{found['weights']['num_bits']}",
                                       "max_abs_deviation": codec.deviation(lw.stored, dtype)}
            if codec.note:
                notes.add(codec.note)
        tensors.update(other_tensors(model, linears))
        quantized = {lw.name for lw in linears}
        ignore = [name for name, m in model.named_modules() if isinstance(m, linear_types()) and name not in quantized]
        formats = sorted({g["format"] for g in groups.values()})
        config_groups = {f"group_{i}": {"targets": g["targets"], "weights": g["weights"],
                                        "input_activations": g["input_activations"], "output_activations": None,
                                        "format": g["format"]}
                         for i, g in enumerate(groups.values())}
        qconfig = {"quant_method": "compressed-tensors", "format": formats[0] if len(formats) == 1 else "mixed-precision",
                   "quantization_status": "compressed", "config_groups": config_groups, "ignore": ignore,
                   "kv_cache_scheme": None, "version": compressed_tensors.__version__}
        rotations = input_rotations(linears, dtype)
        if rotations is not None:
            qconfig["transform_config"], written = rotations
            tensors.update(written)
            result.notes.append(f"online input rotations: {len(written)} matrices written "
                                f"({sum(t.numel() * t.element_size() for t in written.values()) / 2**20:.1f} MiB), "
                                "applied by vLLM's compressed-tensors transforms; transformers does not apply "
                                "transform_config")
        if not linears:  # nothing quantized: a plain transformers checkpoint
            qconfig = None
            result.notes.append("no quantized linear: written as a plain transformers checkpoint")
        result.files = write_checkpoint(model, folder, tensors, qconfig, tokenizer, source)
        result.notes += sorted(notes)
        if any(not g["weights"]["symmetric"] and g["format"] == "pack-quantized" for g in groups.values()):
            result.notes.append("asymmetric pack-quantized groups: transformers with compressed-tensors "
                                f"{compressed_tensors.__version__} loads them with "
                                "quantization_config=CompressedTensorsConfig(dequantize=True) (its compressed path "
                                "expects unpacked zero points, llm-compressor#1618)")
        return result


# activations: format (and fp8 group size) -> compressed-tensors' preset whose input_activations round it the same way
ACTIVATION_PRESETS = {("mxfp4", None): "MXFP4", ("mxfp8", None): "MXFP8", ("fp8", None): "FP8_DYNAMIC",
                      ("fp8", 128): "FP8_BLOCK", ("nvfp4", None): "NVFP4", ("int8", None): "W8A8"}


def static_input_tensors(name: str, fmt: str, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors a static activation rounding writes: NVFP4's ``input_global_scale``; int8's per-tensor
    ``input_scale`` (with its zero point, 0: symmetric), which compressed-tensors' loaders and vLLM divide by."""
    scale = scale.detach().float().cpu().reshape(1)
    if fmt == "int8":
        return {f"{name}.input_scale": scale, f"{name}.input_zero_point": torch.zeros(1, dtype=torch.int8)}
    return {f"{name}.input_global_scale": scale}


def input_activations(activations: Any) -> tuple[dict[str, Any] | None, str | None]:
    """compressed-tensors' ``input_activations`` for an input rounded by ``activations`` (an ``ActivationFormat``)
    with dynamic scales (its preset's own arguments: MXFP4 / MXFP8 blocks of 32, FP8 per token (FP8_DYNAMIC) or
    per group of 128 (FP8_BLOCK), or per group of another size), and None; or None and why it cannot be written.
    Its loaders round as quantlab does (``tests/quant/io/test_compressed_tensors_activations.py``) for FP8, and for
    MX where the scales are taken as compressed-tensors' forward takes them (``scale_rounding: round``), and for
    NVFP4 where its global scale is static (``global_scale: static``: the ``input_global_scale`` the export
    writes), as compressed-tensors' NVFP4 preset keeps it; a global scale taken per call has no such field."""
    fmt, group_size = activations.format, activations.group_size
    if fmt.startswith("mx") and activations.scale_rounding != "round":
        return None, (f"compressed-tensors' forward takes {fmt} activation scales by its rounding of the block maximum "
                      f"(scale_rounding: round); these were measured with {activations.scale_rounding or 'floor'}: "
                      f"set activations: {{format: {fmt}, scale_rounding: round}}")
    if fmt == "nvfp4" and not activations.static:
        return None, ("compressed-tensors' NVFP4 input_activations keep a static input_global_scale calibrated on "
                      "data; these were measured with the global scale taken per call: set activations: "
                      "{format: nvfp4, global_scale: static} (calibrated on the recipe's calibration text)")
    preset = ACTIVATION_PRESETS.get((fmt, group_size))
    if preset is None and fmt != "fp8":
        return None, f"compressed-tensors has no input_activations for {fmt}"
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    if fmt == "int8" and activations.static:  # one calibrated scale for the tensor, written beside the weight
        args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="tensor", dynamic=False)
    elif preset is not None:
        args = PRESET_SCHEMES[preset]["input_activations"]
    else:
        args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="group", group_size=group_size,
                                dynamic=True)
    return args.model_dump(mode="json"), None


def input_rotations(linears: list[LinearWeight], dtype: torch.dtype
                    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """The ``transform_config`` and the tensors that carry the linears' input rotations (``InputRotation``), or
    None where no linear has one. A scheme (``v``, then ``v_1`` ...) holds one kind and one matrix per size, as
    its loaders share them; each matrix is written once, under the first linear of its scheme and size."""
    from compressed_tensors.transform import TransformArgs, TransformConfig, TransformScheme

    schemes: list[tuple[tuple[str, int | None], dict[int, torch.Tensor], list[str]]] = []
    # (kind, head_dim), matrix per size, targets
    tensors: dict[str, torch.Tensor] = {}
    matrices: dict[int, torch.Tensor] = {}  # by rotation module: linears of one input size share theirs
    for lw in linears:
        if lw.input_transform is None:
            continue
        matrix = matrices.setdefault(id(lw.input_transform), lw.input_transform.matrix())
        n = matrix.shape[0]
        block = n if n < lw.stored.shape[1] else None  # a block-diagonal rotation: compressed-tensors' head_dim
        kind = ("hadamard" if lw.input_transform.sylvester else "random-hadamard", block)
        found = next((i for i, (k, held, _) in enumerate(schemes)
                      if k == kind and (n not in held or torch.equal(held[n], matrix))), None)
        if found is None:
            schemes.append((kind, {}, []))
            found = len(schemes) - 1
        _, held, targets = schemes[found]
        if n not in held:
            held[n] = matrix
            tensors[f"{lw.name}.{scheme_name(found)}_input.weight"] = matrix.to(dtype).cpu().contiguous()  # ±1
        targets.append(lw.name)
    if not schemes:
        return None
    config = TransformConfig(config_groups={scheme_name(i): TransformScheme(type=kind, head_dim=block, apply=[
        TransformArgs(targets=targets, location="input"),  # at run time
        TransformArgs(targets=targets, location="weight_input", inverse=True)])  # fused into the weights written
        for i, ((kind, block), _, targets) in enumerate(schemes)})
    return config.model_dump(mode="json"), tensors


def scheme_name(i: int) -> str:
    return "v" if i == 0 else f"v_{i}"
