"""The sensitivity sweep's views: the ranked table as Markdown and CSV, and the heatmap of mean KL by decoder layer
and module type."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write_text
from ..quant.mixed.sensitivity import SCAN_TOP_K
from .plots import STYLE, plt, to_svg


def heatmap(table: list[dict[str, Any]], formats: list[str], granularity: str, kinds: list[str | None]) -> str:
    """Mean KL by decoder layer (rows) and module type (columns, in ``kinds``' order), one panel per format, on
    one logarithmic colour scale (a few groups are often orders of magnitude above the rest), as an SVG."""
    from matplotlib.colors import LogNorm

    layers = sorted({r["layer"] for r in table if r["layer"] is not None}) or [None]
    kinds = [k for k in kinds if k is not None] or [None]
    grids = {f: torch.full((len(layers), len(kinds)), float("nan")) for f in formats}
    for r in table:
        rows = [layers.index(r["layer"])] if r["layer"] in layers else range(len(layers))
        cols = [kinds.index(r["module_type"])] if r["module_type"] in kinds else range(len(kinds))
        for i in rows:
            for j in cols:
                grids[r["format"]][i, j] = r["kl_divergence_mean"]
    values = torch.cat([g[g > 0] for g in grids.values()])
    norm = LogNorm(vmin=values.min().item(), vmax=values.max().item()) if values.numel() else None
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(formats), squeeze=False,
                                 figsize=(1.6 + (0.9 * len(kinds) + 0.6) * len(formats), 1.2 + 0.22 * len(layers)))
        for ax, f in zip(axes[0], formats):
            image = ax.imshow(grids[f].numpy(), aspect="auto", cmap="magma_r", norm=norm)
            ax.set_xticks(range(len(kinds)), [k or "all linears" for k in kinds], rotation=45, ha="right")
            ax.set_yticks(range(len(layers)), ["all layers" if i is None else str(i) for i in layers])
            ax.set_title(f"{f}: one {granularity} at a time", fontsize=9)
        axes[0][0].set_ylabel("decoder layer")
        fig.colorbar(image, ax=list(axes[0]), label="mean KL from the baseline (nats, log scale)")
        return to_svg(fig)


def write_tables(out: Path, result: Any) -> None:
    """sensitivity.csv, sensitivity.md and sensitivity.svg of a finished sweep (``run.sensitivity``)."""
    import pandas as pd

    table, formats, granularity, stamp, kinds = (result.rows, result.formats, result.granularity, result.stamp,
                                                 result.kinds)
    atomic_write_text(out / "sensitivity.csv", pd.DataFrame(table).to_csv(index=False))
    lines = [f"# Sensitivity to {', '.join(formats)} ({granularity})", "",
             "Each row: only this group in this format, everything else as the baseline "
             f"({stamp['baseline']}); most sensitive first. Scored on {stamp['scored_tokens']:,} tokens of "
             f"{stamp['text']} (sha256 {stamp['text_sha256'][:12]}) in windows of {stamp['window_tokens']}. A ranking: "
             f"KL from the baseline's top {SCAN_TOP_K} tokens plus one bucket for the rest, so each figure is a lower "
             "bound (the variants' own divergence, in a run's report, is exact).", "",
             "| rank | group | format | mean KL | KL p99 | top-1 same % | Δppl |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(table, 1):
        lines.append(f"| {i} | {r['group']} | {r['format']} | {r['kl_divergence_mean']:.5f} | {r['kl_divergence_p99']:.4f} | "
                     f"{r['top1_agreement_percent']:.2f} | {r['delta_perplexity']:+.3f} |")
    lines += ["", "![heatmap](sensitivity.svg)", ""]
    atomic_write_text(out / "sensitivity.md", "\n".join(lines))
    atomic_write_text(out / "sensitivity.svg", heatmap(table, formats, granularity, kinds))
