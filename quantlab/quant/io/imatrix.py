"""Importance matrices in llama.cpp's files, so either tool can use the other's.

``llama-imatrix`` writes a GGUF (its default since 2025): ``general.type = imatrix``, ``imatrix.datasets``,
``imatrix.chunk_count`` and ``imatrix.chunk_size``, and per weight (by its GGUF name, ``blk.0.attn_q.weight``) the
float32 tensors ``<name>.in_sum2`` (the summed squared inputs per column, ``[1, n]``), ``<name>.counts`` (the
tokens summed, ``[1, 1]``) and ``<name>.in_sum`` (the summed inputs). Its older ``.dat`` file holds, per weight,
the mean squared input times the number of chunks, and that chunk count. Both read back to the per-column mean
squared input ``llama-quantize`` weighs the rounding with (``in_sum2 / counts``).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import UnsupportedError
from ..calibrate.imatrix import ImatrixAccumulator

GENERAL_TYPE = "imatrix"


def write_imatrix(path: str | Path, sums: dict[str, ImatrixAccumulator], datasets: list[str], chunk_size: int) -> Path:
    """``sums`` (GGUF tensor name → accumulator) as llama-imatrix's GGUF file at ``path``."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # renamed into place whole
    writer = gguf.GGUFWriter(str(partial), arch="")
    writer.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE, None)  # llama-imatrix's file names no architecture
    writer.add_string("general.type", GENERAL_TYPE)
    writer.add_array("imatrix.datasets", datasets)
    tokens = max((acc.rows for acc in sums.values()), default=0)
    writer.add_uint32("imatrix.chunk_count", tokens // max(chunk_size, 1))
    writer.add_uint32("imatrix.chunk_size", chunk_size)
    for name in sorted(sums):
        acc = sums[name]
        writer.add_tensor(f"{name}.in_sum2", acc.sum_squares.float().numpy().reshape(1, -1))
        writer.add_tensor(f"{name}.counts", np.array([[float(acc.rows)]], dtype=np.float32))
        writer.add_tensor(f"{name}.in_sum", acc.sums.float().numpy().reshape(1, -1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, path)
    return path


def read_imatrix(path: str | Path) -> dict[str, torch.Tensor]:
    """GGUF tensor name → the per-column mean squared input (float32 ``[n]``) from a llama.cpp imatrix file: its
    GGUF form, or the legacy ``.dat``."""
    path = Path(path)
    with path.open("rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _read_gguf(path)
    return _read_dat(path)


def _read_gguf(path: Path) -> dict[str, torch.Tensor]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    kind = reader.fields.get("general.type")
    if kind is None or kind.contents() != GENERAL_TYPE:
        raise UnsupportedError(f"{path}: a GGUF without general.type = imatrix is not an importance matrix")
    tensors = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
    out = {}
    for key, sum2 in tensors.items():
        if not key.endswith(".in_sum2"):
            continue
        name = key.removesuffix(".in_sum2")
        counts = tensors.get(f"{name}.counts")
        if counts is None:
            raise UnsupportedError(f"{path}: {name} has in_sum2 and no counts")
        rows = sum2.reshape(counts.size, -1)  # one row per expert matrix; dense weights have one
        mean = np.where(counts.reshape(-1, 1) > 0, rows / np.maximum(counts.reshape(-1, 1), 1), 0)
        out[name] = torch.from_numpy(mean.reshape(-1).astype(np.float32))
    return out


def _read_dat(path: Path) -> dict[str, torch.Tensor]:
    data = path.read_bytes()
    offset = 0

    def take(fmt: str) -> Any:
        nonlocal offset
        size = struct.calcsize(fmt)
        if offset + size > len(data):
            raise UnsupportedError(f"{path}: not a llama.cpp imatrix file (it ends inside an entry)")
        values = struct.unpack_from(fmt, data, offset)
        offset += size
        return values

    (entries,) = take("<i")
    if entries < 1:
        raise UnsupportedError(f"{path}: not a llama.cpp imatrix file (no entries)")
    out = {}
    for _ in range(entries):
        (length,) = take("<i")
        name = data[offset: offset + length].decode()
        offset += length
        ncall, nval = take("<ii")
        values = np.frombuffer(data, dtype="<f4", count=nval, offset=offset).astype(np.float32)
        offset += 4 * nval
        out[name] = torch.from_numpy(values / max(ncall, 1))  # stored as the mean times the chunk count
    return out
