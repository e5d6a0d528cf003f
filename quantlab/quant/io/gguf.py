"""GGUF for llama.cpp: each quantized linear in the ggml type that holds its numbers, written by its stored
form's codec (``quant/forms/<form>/codecs.py``): integer codes in blocks of 32 as Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, ggml
blocks (the ``gguf`` weight format: Q2_K … Q6_K, IQ4_NL, IQ4_XS and the legacy types, quantized by ggml's own code)
as they are held, byte for byte, MXFP4 as ggml's MXFP4. Forms without a ggml type holding their numbers are refused
with the nearest format that exports. Tensors left in floating point are written in their dtype (F32, F16,
BF16); norms in F32, as llama.cpp expects. Names, the llama-family Q/K row order and Gemma's ``1 + weight`` norms
follow llama.cpp's converter; metadata and tokenizer come from the model's source GGUF when it was loaded from
one, otherwise from its config and tokenizer folder (llama, mistral, qwen2, gemma3 and gpt2: ``gguf_metadata``).
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...errors import UnsupportedError
from ..codecs.gguf import GGUFCodec
from ..linear import QuantizedLinear, linear_types, linear_weight
from ..tensors.base import WeightTensor
from .export import EXPORTERS, Exporter, ExportResult, LinearWeight, other_tensors
from .gguf_metadata import metadata_from_config, tokenizer_from_folder

GGUF_FILE = "model.gguf"
# transformers model_type -> llama.cpp architecture
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "gemma3": "gemma3", "gemma3_text": "gemma3",
                 "gpt2": "gpt2"}
PERMUTES_QK = ("llama",)  # llama.cpp's converter reorders Q and K rows for these
NORM_PLUS_ONE = ("gemma3",)  # Gemma's RMSNorm multiplies by 1 + weight; llama.cpp stores 1 + weight
# the file's general.file_type for its most common tensor type (llama.cpp's llama_ftype; a k-quant alone: its _S)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 11,
              "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32, "MXFP4": 38,
              "NVFP4": 39}


def dense_array(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A floating-point tensor as the bytes of its own ggml type."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.uint8).numpy(), "BF16"
    if t.dtype == torch.float16:
        return t.numpy(), "F16"
    return t.float().numpy(), "F32"


def qk_rows(name: str, config: Any, rows: int) -> torch.Tensor | None:
    """llama.cpp's converter's row order for a llama-family Q or K projection of ``rows`` outputs (its
    ``permute``, which transformers' GGUF loader undoes), else None."""
    if name.endswith("q_proj"):
        heads = config.num_attention_heads
    elif name.endswith("k_proj"):
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    else:
        return None
    return torch.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def architecture(config: Any, reader: Any | None) -> str:
    """llama.cpp's architecture name for the model: its source GGUF's (``reader``), else from its model_type."""
    if reader is not None:
        return _field(reader, "general.architecture")
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedError(f"model_type {model_type!r} has no GGUF architecture here (known: "
                               f"{', '.join(sorted(ARCHITECTURES))})")
    return ARCHITECTURES[model_type]


def _reader(path: Path) -> Any:
    import gguf

    return gguf.GGUFReader(str(path))


def _field(reader: Any, name: str) -> Any:
    f = reader.fields.get(name)
    return None if f is None else f.contents()


@EXPORTERS.register("gguf", "a GGUF file for llama.cpp: ggml-typed weights (format gguf) as their blocks, "
                    "Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks from integer codes in groups of 32s, floating point as it is; "
                    "per-module mixes keep each tensor's type")
class GGUFExporter(Exporter):
    name = "gguf"
    nearest = ("format: gguf with any ggml type (type: Q4_K ...), int4 with group_size: 32 (Q4_1), with symmetric: "
               "true (Q4_0), int8 with group_size: 32, symmetric: true (Q8_0), or mxfp4")

    def check_available(self) -> None:
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise UnsupportedError("exporting to GGUF needs the gguf package (pip install gguf)") from None

    def write(self, model: nn.Module, linears: list[LinearWeight], folder: Path, tokenizer: Any | None,
              source: Path | None) -> ExportResult:
        import gguf

        config = model.config
        reader = _reader(source) if source is not None and source.suffix == ".gguf" else None
        arch = architecture(config, reader)
        names = tensor_name_map(arch, config)
        path = folder / GGUF_FILE
        writer = gguf.GGUFWriter(str(path), arch)
        result = ExportResult("gguf", folder, [GGUF_FILE])
        counts: dict[str, int] = {}
        dense = other_tensors(model, linears)
        linear_like = {name: m for name, m in model.named_modules() if isinstance(m, linear_types())}
        tensors: list[tuple[str, np.ndarray, str, dict[str, Any]]] = []
        shared = _embedding_sharing_head(model)  # the head's blocks are the token embedding's: written once, as it
        for lw in linears:
            name = lw.name
            codec = self.codec(lw.stored)
            assert isinstance(codec, GGUFCodec)
            kind = codec.ggml_type(lw.stored)
            blocks = codec.encode(lw.stored, kind)
            deviation = 0.0 if codec.exact else _deviation(blocks, kind, lw.stored)
            rows = qk_rows(name, config, blocks.shape[0]) if arch in PERMUTES_QK else None
            if rows is not None:
                blocks = blocks[rows.numpy()]
            key = f"{shared[1]}.weight" if shared is not None and name == shared[0] else f"{name}.weight"
            tensors.append((key, blocks, kind, {"max_abs_deviation": deviation}))
            counts[kind] = counts.get(kind, 0) + lw.stored.shape[0] * lw.stored.shape[1]
            if lw.bias is not None:
                dense[f"{name}.bias"] = lw.bias
        for key, t in dense.items():
            t = t.detach().cpu()
            stem = key.rsplit(".", 1)[0]
            if stem in linear_like and key.endswith(".weight"):
                t = linear_weight(linear_like[stem]).detach().cpu().contiguous()  # GPT-2's Conv1D holds [in, out]
            if arch in PERMUTES_QK and (rows := qk_rows(stem, config, t.shape[0])) is not None:
                t = t[rows]
            if t.dim() == 1 or "norm" in key:
                t = t.float() + (1.0 if arch in NORM_PLUS_ONE and key.endswith("norm.weight") else 0.0)
            array, kind = dense_array(t)
            tensors.append((key, array, kind, {}))
        for key, array, kind, info in tensors:
            stem, suffix = key.rsplit(".", 1)
            gguf_name = names.get_name(stem)
            if gguf_name is None:
                raise UnsupportedError(f"{key}: no GGUF tensor name for it in architecture {arch}")
            raw = getattr(gguf.GGMLQuantizationType, kind)
            writer.add_tensor(f"{gguf_name}.{suffix}", array, raw_dtype=raw if array.dtype == np.uint8 else None)
            result.tensors[f"{gguf_name}.{suffix}"] = {"module": key, "type": kind, "bytes": int(array.nbytes), **info}
        main = max(counts, key=counts.get) if counts else tensors[0][2]  # mostly this type
        if reader is not None:
            _copy_metadata(writer, reader)
            result.notes.append(f"metadata and tokenizer copied from {source.name}")
            carried = _copy_extra_tensors(writer, reader, set(result.tensors))
            if carried:
                result.notes.append(f"tensors the model does not hold, copied from {source.name} as they are: "
                                    f"{', '.join(carried)}")
        else:
            metadata_from_config(writer, arch, config)
            with _tokenizer_folder(source, tokenizer) as folder:
                tokenizer_from_folder(writer, folder)
            result.notes.append("metadata from the model's config, tokenizer from its folder")
        writer.add_file_type(FILE_TYPES[main])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return result


def _embedding_sharing_head(model: nn.Module) -> tuple[str, str] | None:
    """``(head, embedding)`` module names when the token embedding reads the output head's blocks (a tied
    ``BlockEmbedding``), else None."""
    from ..embedding import BlockEmbedding

    table = model.get_input_embeddings()
    if not (isinstance(table, BlockEmbedding) and table.tied):
        return None
    head = model.get_output_embeddings()
    names = {id(m): n for n, m in model.named_modules()}
    return names[id(head)], names[id(table)]


def tensor_name_map(arch: str, config: Any) -> Any:
    """gguf-py's transformers → GGUF tensor name map for llama.cpp's architecture ``arch``."""
    import gguf

    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    return gguf.get_tensor_name_map(enum, config.num_hidden_layers)


def linear_tensor_names(model: nn.Module) -> dict[str, str]:
    """Each linear module's GGUF tensor name (``model.layers.0.self_attn.q_proj`` → ``blk.0.attn_q.weight``), as
    llama.cpp's converter names them for the model's architecture (the output head: ``output.weight``)."""
    names = tensor_name_map(architecture(model.config, None), model.config)
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, (*linear_types(), QuantizedLinear)):
            stem = names.get_name(name)
            if stem is not None:
                found[name] = f"{stem}.weight"
    return found


def _deviation(blocks: np.ndarray, kind: str, q: WeightTensor) -> float:
    """Largest ``|llama.cpp's dequantization − quantlab's|`` over the tensor (gguf-py's reference decoder)."""
    import gguf

    theirs = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind))
    return float(np.abs(theirs - q.dequantize(torch.float32).numpy()).max())


SKIPPED_KEYS = ("general.architecture", "general.file_type", "general.quantization_version")


def _copy_metadata(writer: Any, reader: Any) -> None:
    """Every key of the source GGUF but those this file sets itself (as gguf-py's ``gguf_new_metadata``)."""
    import gguf

    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in SKIPPED_KEYS:
            continue
        kind = f.types[0]
        sub = f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), kind, sub_type=sub)


def _copy_extra_tensors(writer: Any, reader: Any, written: set[str]) -> list[str]:
    """Tensors of the source GGUF that have no counterpart in the model (llama 3's ``rope_freqs``, which
    transformers keeps in its config instead), written as they are so llama.cpp computes as it did."""
    import gguf

    carried = []
    for t in reader.tensors:
        if t.name in written:
            continue
        quantized = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type if quantized else None)
        carried.append(t.name)
    return carried


@contextmanager
def _tokenizer_folder(source: Path | None, tokenizer: Any | None) -> Iterator[Path | None]:
    """The folder holding the model's ``tokenizer.json``: its source folder, else the loaded tokenizer saved."""
    if source is not None and (source / "tokenizer.json").is_file() or tokenizer is None:
        yield source
        return
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        yield Path(tmp)
