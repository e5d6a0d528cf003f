"""Flat rows from records: one object per variant (its first decode point at the top level, every point in
``decode_points``), derived figures computed from each row's own recorded inputs. results.jsonl, the CSV, the
Parquet file and the reports are all built from these rows."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ValidationError

from ..errors import QuantlabError
from ..measurements import all_measurements

IDENTITY = ("variant", "variant_key", "recipe", "model", "weight_format", "kv_format", "status", "error")
RUN_FIELDS = ("new_tokens", "host", "device", "fingerprint_id", "sweep", "started_at", "finished_at", "wall_s",
              "memory_bandwidth_bytes_per_s", "memory_bandwidth_after_bytes_per_s", "memory_bandwidth_method",
              "environment", "exports")


def _validated(name: str, m: Any, data: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        return m.result.model_validate(data).model_dump()
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise QuantlabError(f"{where}: measurement {name!r}: field {field!r}: {err['msg']}") from None


def flat_row(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """The record of one variant as a flat row, derived measurements computed from its own inputs."""
    row: dict[str, Any] = {k: record.get(k) for k in IDENTITY}
    row.update({k: record[k] for k in RUN_FIELDS if k in record})
    row["host"] = (record.get("fingerprint") or {}).get("host", record.get("host"))
    measured = record.get("measurements") or {}
    measurements = all_measurements()
    for name, m in measurements:
        if m.scope == "variant" and not m.derived and name in measured:
            row.update(m.flat(_validated(name, m, measured[name], where)))
    points = []
    for p in record.get("points") or []:
        point: dict[str, Any] = {"batch_size": p["batch_size"], "prompt_tokens": p["prompt_tokens"]}
        for name, m in measurements:
            if m.scope == "point" and not m.derived and name in (p.get("measurements") or {}):
                point.update(m.flat(_validated(name, m, p["measurements"][name], where)))
        for name, m in measurements:
            if m.scope == "point" and m.derived:
                result = m.derive({**row, **point})
                if result is not None:
                    point.update(m.flat(result.model_dump()))
        points.append(point)
    if points:
        row.update(points[0])
        row["decode_points"] = points
    for name, m in measurements:
        if m.scope == "variant" and m.derived:
            result = m.derive(row)
            if result is not None:
                row.update(m.flat(result.model_dump()))
    return row


def leave_out_unread_kv(rows: list[dict[str, Any]], baseline: str) -> None:
    """Quality figures that did not go through a row's KV cache (``Measurement.reads_kv_cache`` False) are
    left out of rows whose KV format is not the baseline's: they would repeat the twin's figure with the
    baseline's cache. Such a row lists the measurements in ``kv_cache_not_read_by`` (its record keeps them)."""
    base_kv = next((r.get("kv_format") for r in rows if r.get("variant") == baseline), None)
    if base_kv is None:
        return
    shown_by = [(name, m, {f for c in m.columns_for(rows) for f in (c.field, *(c.spread or ()))})
                for name, m in all_measurements()]
    for row in rows:
        if row.get("status") != "ok" or row.get("kv_format") == base_kv:
            continue
        left_out = []
        for name, m, shown in shown_by:
            numbers = {f for f in m.result.model_fields if isinstance(row.get(f), (int, float))}
            fields = sorted(f for f in shown | numbers if row.get(f) is not None)
            if fields and m.reads_kv_cache(row) is False:
                left_out.append(name)
                for f in fields:
                    row[f] = None
        if left_out:
            row["kv_cache_not_read_by"] = left_out


def record_from_flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A record from a row of a results.jsonl written before per-variant records. Its machine is known only by
    host name and device, so its fingerprint never matches: it is shown, and measured again by the next run."""
    fingerprint = {"legacy": True, "host": row.get("host"), "device": row.get("device")}
    record: dict[str, Any] = {
        "record_version": 2, **{k: row.get(k) for k in IDENTITY}, "sweep": -1, "fingerprint": fingerprint,
        "fingerprint_id": "legacy-" + hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:12],
        "writer": {"host": row.get("host")},
        **{k: row[k] for k in RUN_FIELDS if k in row and k not in ("host", "fingerprint_id", "sweep")},
        "measurements": {}, "points": [],
    }
    if row.get("status") != "ok":
        return record
    base = {k: v for k, v in row.items() if k != "decode_points"}
    measurements = all_measurements()
    for name, m in measurements:
        if m.scope == "variant" and not m.derived:
            found = m.unflat(base)
            if found:
                record["measurements"][name] = found
    for p in row.get("decode_points") or [base]:
        merged = {**base, **p}
        point = {"batch_size": merged.get("batch_size"), "prompt_tokens": merged.get("prompt_tokens"), "measurements": {}}
        for name, m in measurements:
            if m.scope == "point" and not m.derived:
                found = m.unflat(merged)
                if found:
                    point["measurements"][name] = found
        record["points"].append(point)
    return record
