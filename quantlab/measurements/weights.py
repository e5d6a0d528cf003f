"""Weight bytes by component: measured from the tensors, from each format's formula, and from the config alone."""
from __future__ import annotations

from typing import Any

from ..engine.memory import (
    decode_weight_bytes_read,
    weight_bytes_analytic,
    weight_bytes_by_component,
    weight_bytes_by_device,
)
from .base import MIB, Column, Measurement, Result, engine_notes, register


class WeightBytes(Result):
    weight_bytes: int
    weight_bytes_analytic: int
    weight_bytes_estimate: int | None = None
    estimate_params_source: str | None = None
    weight_bytes_quantized_linear: int
    weight_bytes_linear: int
    weight_bytes_embedding: int
    weight_bytes_other: int
    decode_weight_bytes_read: int
    quantized_modules: int
    kernel_path: str
    quantize_s: float
    weights_source: dict[str, Any] | None = None  # {"quantized": "here"[, "saved": ...]} or {"reused": ..., ...}
    weights_digest: str | None = None  # SHA-256 of the quantized linears' stored bytes (what an export must match)
    device_map: dict[str, str] | None = None  # accelerate's placement, when the recipe gave model.device_map
    weight_bytes_by_device: dict[str, int] | None = None  # held per device, and offloaded to cpu or disk


def kernel_paths(model: Any) -> str:
    paths = sorted({m.kernel_path for m in model.modules() if hasattr(m, "kernel_path")})
    return ",".join(paths) or "dense"


def _places(device_map: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for where in device_map.values():
        counts[where] = counts.get(where, 0) + 1
    return ", ".join(f"{n} module(s) on {where}" for where, n in counts.items())


def _placement(model: Any) -> dict[str, Any]:
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return {}
    return {"device_map": {k: str(v) for k, v in device_map.items()}, "weight_bytes_by_device": weight_bytes_by_device(model)}


@register("weights", "bytes of every parameter and buffer after quantization, by component, beside the formulas")
class Weights(Measurement):
    order = 10
    result = WeightBytes
    title = "weights"
    columns = (
        Column("weight_bytes", "weights MiB", ".3f", MIB, compare="ratio", higher_is_better=False),
        Column("weight_bytes_analytic", "analytic MiB", ".3f", MIB),
        Column("weight_bytes_estimate", "config estimate MiB", ".3f", MIB),
        Column("kernel_path", "kernel path", ""),
    )

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        from ..quant.io.export import weights_digest

        model = ctx.model
        served = ctx.served()
        if served is None:
            components = weight_bytes_by_component(model)
            analytic, read, path = weight_bytes_analytic(model), decode_weight_bytes_read(model), kernel_paths(model)
        else:  # the file the engine holds: its tensors' bytes (each type's block formula), all read by a step
            components = served.weight_components()
            analytic = read = sum(components.values())
            path = served.kernel_path
        estimate = ctx.estimate
        predicted = estimate.beside_measured(ctx.variant.weight, ctx.variant.kv, []) if estimate else {}
        return WeightBytes(
            weight_bytes=sum(components.values()), weight_bytes_analytic=analytic,
            weight_bytes_estimate=predicted.get("weight_bytes_estimate"),
            estimate_params_source=predicted.get("estimate_params_source"),
            **{f"weight_bytes_{k}": v for k, v in components.items()},
            decode_weight_bytes_read=read,
            quantized_modules=len(ctx.quantize_report.replaced), kernel_path=path,
            quantize_s=ctx.quantize_s, weights_source=ctx.weights_source or None, weights_digest=weights_digest(model),
            **_placement(model))

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        return ("measured: bytes of every parameter and buffer the model holds after quantization (packed codes, "
                "scales and zero points included; tied tensors counted once). **analytic**: the same total from each "
                "format's bits, group size and metadata, layer by layer on the quantized model. **config estimate**: "
                "predicted from the model's config alone, before loading (`quantlab estimate`: "
                f"{row.get('estimate_params_source') or 'the module tree'} × the format's byte formula)."
                + (f" Placed by accelerate's device map ({_places(row['device_map'])}); held per device: "
                   f"{', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in (row.get('weight_bytes_by_device') or {}).items())}."
                   if row.get("device_map") else "")
                + engine_notes(rows, "weights"))
