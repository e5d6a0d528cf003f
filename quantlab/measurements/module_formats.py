"""Which format each linear ended up in, for variants that mix formats (overrides, budgeted mixes)."""
from __future__ import annotations

import re

from .base import Column, Measurement, Result, register

_LAYER = re.compile(r"\.(\d+)\.")


class ModuleFormats(Result):
    module_formats: dict[str, str]  # module name -> the format label it is stored in
    module_format_bytes: dict[str, int]  # format label -> bytes its linears hold (measured)
    module_format_summary: str  # per format: how many linears, and which (module type: layers)


def _ranges(numbers: list[int]) -> str:
    """``0-3,5,7-8`` from sorted integers."""
    out: list[str] = []
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(out)


def summarize(module_formats: dict[str, str]) -> str:
    """``int8-pc-asym ×6 (v_proj 0-2; down_proj 0,1) · int4-g128-asym ×30 (...)``: linears per format, by module
    type and decoder layer (a linear outside the numbered layers by its name)."""
    by_format: dict[str, dict[str, list[int]]] = {}
    for name, fmt in module_formats.items():
        found = _LAYER.search(name)
        kind = name.rsplit(".", 1)[-1] if found else name
        by_format.setdefault(fmt, {}).setdefault(kind, []).extend([int(found.group(1))] if found else [])
    parts = []
    for fmt, kinds in by_format.items():
        count = sum(1 for f in module_formats.values() if f == fmt)
        where = "; ".join(f"{kind} {_ranges(sorted(layers))}" if layers else kind for kind, layers in kinds.items())
        parts.append(f"{fmt} ×{count} ({where})")
    return " · ".join(parts)


@register("module_formats", "the format of every linear, for variants whose linears are not all in one format")
class ModuleFormatsMeasurement(Measurement):
    order = 20
    result = ModuleFormats
    title = "per-module formats"
    section = "Per-module formats"
    columns = (Column("module_format_summary", "linears per format (module type: decoder layers)", ""),)

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        from ..engine.memory import weight_bytes_by_component

        details = ctx.quantize_report.details if ctx.quantize_report else {}
        formats = {name: d["format"] for name, d in details.items() if "format" in d}
        if not formats:
            return None
        stored: dict[str, int] = {}
        for name, fmt in formats.items():
            stored[fmt] = stored.get(fmt, 0) + sum(weight_bytes_by_component(ctx.model.get_submodule(name)).values())
        return ModuleFormats(module_formats=formats, module_format_bytes=stored, module_format_summary=summarize(formats))

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        mixed = [r for r in rows if r.get("module_format_bytes")]
        return ("the format each quantized linear was stored in, as the variant's format assigned it (a budgeted mix "
                "by its knapsack, an entry by its overrides); bytes per format, measured: "
                + "; ".join(f"{r['variant']}: " + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in r["module_format_bytes"].items())
                            for r in mixed) + ".")
