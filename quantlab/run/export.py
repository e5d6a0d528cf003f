"""Deployable folders from a run: a recipe's ``export:`` writes them from each measured model as it is measured,
``quantlab export`` from a finished run (the variant's weight format applied again, then checked against the
digest its record holds, so the folder holds the numbers that were measured)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import QuantlabError, first_line
from ..files import export_folder
from ..models import model_source
from ..progress import stage


def export_measured(ctx: Any, targets: list[str]) -> list[dict[str, Any]]:
    """Export the variant ``ctx`` just measured to each target; a refusal is recorded, the variant stays measured."""
    from ..quant.io import export_

    if ctx.run_folder is None:
        return []
    results = []
    for to in targets:
        out = export_folder(ctx.run_folder, ctx.variant.label, to)
        try:
            with stage(f"exporting to {to}"):
                result = export_(ctx.model, to, out, tokenizer=ctx.loaded.tokenizer,
                                 source=model_source(ctx.recipe.model))
            results.append({"to": to, "folder": str(out.relative_to(ctx.run_folder)), "files": result.files,
                            "max_abs_deviation": result.max_abs_deviation})
        except QuantlabError as e:
            results.append({"to": to, "error": first_line(e)})
    return results


def export_from_run(run_dir: Path, label: str, to: str, out: Path) -> Any:
    """Export variant ``label`` (or the first variant of weight format ``label``) of the run in ``run_dir``."""
    from ..engine.device import resolve_device
    from ..quant.io import EXPORTERS, export_
    from ..quant.io.export import weights_digest
    from ..records.folder import RunFolder
    from .lifecycle import VariantContext
    from .recipe import validate_recipe

    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise QuantlabError(f"{run_dir}: no manifest.json (not a quantlab run folder)")
    if out.exists() and not out.is_dir():
        raise QuantlabError(f"--out {out}: an existing file, not a folder; name the folder to write")
    EXPORTERS[to].build().check_available()  # an unknown target names the known ones; a missing writer its extra
    recipe = validate_recipe(json.loads(manifest_path.read_text())["recipe"], str(manifest_path))
    variant = recipe.variant_named(label)
    if variant is None:
        raise QuantlabError(f"{run_dir}: --variant {label!r} is no variant or weight-format label of the run (labels: "
                            f"{', '.join(v.label for v in recipe.variants())})")
    refusal = variant.weight.export_refusal(to)
    if refusal:  # the config decides: refused before the model is loaded
        raise QuantlabError(f"{variant.label}: {refusal}")
    record = RunFolder(run_dir).read_record(variant.key) or {}
    measured = ((record.get("measurements") or {}).get("weights") or {}).get("weights_digest") \
        if record.get("status") == "ok" else None
    ctx = VariantContext(recipe, variant, resolve_device(recipe.device), None)
    ctx.load_and_quantize()
    digest = weights_digest(ctx.model)
    if measured is not None and digest != measured:
        raise QuantlabError(f"{variant.label}: quantizing again here gave other numbers than the run measured (digest "
                            f"{digest} vs {measured}: another device, library version or calibration); export from "
                            "the run itself with the recipe's export: field")
    result = export_(ctx.model, to, out, tokenizer=ctx.loaded.tokenizer, source=model_source(recipe.model))
    result.notes.append(f"variant {variant.label} of {run_dir}" + (f", weights digest {digest} as measured"
                                                                    if measured else ", no digest recorded to check"))
    return result

