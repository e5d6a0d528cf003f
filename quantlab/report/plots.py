"""Report plots as inline SVG (matplotlib, no files, no network): the same input gives the same bytes."""
from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .table import MIB, column, footprint_bytes, has_metric, measured, pareto_variants  # noqa: E402

_MPL = tuple(int(p) for p in matplotlib.__version__.split(".")[:2])
STYLE = {"svg.hashsalt": "quantlab", "svg.fonttype": "path", "font.size": 9, "axes.spines.top": False,
         "axes.spines.right": False}


def to_svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "quantlab"})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


LABEL_OFFSETS = [(4, 3), (4, -10), (-4, 3), (-4, -10), (4, 13), (4, -20), (-4, 13), (-4, -20), (4, 23), (4, -30),
                 (-4, 23), (-4, -30)]  # points; a negative x offset puts the label's right end at the point


def place_labels(ax: Any, points: list[tuple[float, float, str]]) -> list[Any]:
    """Annotate each ``(x, y, text)`` beside its point where it stays on the figure and overlaps no label placed
    before it (trying ``LABEL_OFFSETS`` in turn). A label with no free place is listed under the axes instead,
    so no two labels ever overlap. Returns the placed labels' boxes in display units; in the SVG each label is
    the group ``point-label-<n>``."""
    ax.figure.canvas.draw()  # settle the axes' limits, which place the points on the page
    renderer = ax.figure.canvas.get_renderer()
    page = ax.figure.bbox
    placed: list[Any] = []
    unplaced: list[str] = []
    for x, y, text in sorted(points, key=lambda p: (p[0], p[1])):
        for dx, dy in LABEL_OFFSETS:
            note = ax.annotate(text, (x, y), fontsize=7, xytext=(dx, dy), textcoords="offset points",
                               ha="left" if dx >= 0 else "right", annotation_clip=False,
                               gid=f"point-label-{len(placed)}")
            box = note.get_window_extent(renderer)
            inside = page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
            if inside and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            note.remove()
        else:
            unplaced.append(text)
    if unplaced:
        ax.text(0, -0.16, "also plotted, no room for a label: " + ", ".join(unplaced), transform=ax.transAxes,
                fontsize=7, va="top", wrap=True, gid="unplaced-labels")
    return placed


def pareto_plot(frame: pd.DataFrame, baseline: str, metric: str = "perplexity", ylabel: str = "perplexity") -> str | None:
    """Perplexity (or another loss ``metric``) against weight + KV bytes, the Pareto front joined and ringed."""
    if not has_metric(frame, metric):
        return None
    ok = measured(frame)
    ok = ok[ok[metric].notna()]  # a row without the figure (left out: it did not read its cache) is not a point
    with plt.rc_context(STYLE):
        x, y = footprint_bytes(ok) / MIB, ok[metric].astype(float)
        front = list(pareto_variants(ok, metric).values())
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        ax.scatter(x, y, color="#8a8a8a", zorder=2, label="variant")
        fx = [(a, b) for a, b, f in zip(x, y, front) if f]
        if fx:
            fx.sort()
            ax.plot([a for a, _ in fx], [b for _, b in fx], color="#c0392b", lw=1.2, zorder=1)
            ax.scatter([a for a, _ in fx], [b for _, b in fx], s=70, facecolors="none", edgecolors="#c0392b",
                       zorder=3, label="Pareto front")
        at: dict[tuple[float, float], list[str]] = {}  # variants at the same point share one label
        for label, a, b in zip(ok["variant"], x, y):
            at.setdefault((round(a, 3), round(b, 3)), []).append(label + (" (baseline)" if label == baseline else ""))
        place_labels(ax, [(a, b, ", ".join(labels)) for (a, b), labels in at.items()])
        ax.set_xlabel("weights + KV cache, MiB (measured)")
        ax.set_ylabel(ylabel)
        ax.legend(frameon=False, fontsize=8)
        return to_svg(fig)


def noisy_left_out(rows: list[dict[str, Any]]) -> list[str]:
    """The variants whose first decode point was timed on a noisy machine: the latency plots leave them out."""
    return [r["variant"] for r in rows if r.get("status") == "ok" and r.get("noisy")]


def latency_plot(rows: list[dict[str, Any]]) -> str | None:
    """Per-token decode times at each variant's first point: box of the steps (p10–p90 bar if none kept). Rows
    timed on a noisy machine are left out (their spread would set the axis)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("decode_ms_per_token") is not None and not r.get("noisy")]
    if not ok:
        return None
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(ok) + 1.2))
        labels = [r["variant"] for r in ok]
        samples = [r.get("decode_ms_samples") for r in ok]
        if all(samples):
            horizontal = {"orientation": "horizontal"} if _MPL >= (3, 10) else {"vert": False}
            ax.boxplot(samples, whis=(10, 90), showfliers=True, widths=0.6, flierprops={"markersize": 2},
                       medianprops={"color": "#c0392b"}, **horizontal)
            ax.set_yticks(range(1, len(ok) + 1), labels)
            ax.set_xlabel("decode ms per token (box: p25–p75, whiskers p10–p90, every timed step)")
        else:
            med = [r["decode_ms_per_token"] for r in ok]
            lo = [m - r.get("decode_ms_p10", m) for m, r in zip(med, ok)]
            hi = [r.get("decode_ms_p90", m) - m for m, r in zip(med, ok)]
            ax.errorbar(med, range(len(ok)), xerr=[lo, hi], fmt="o", color="#c0392b", capsize=3)
            ax.set_yticks(range(len(ok)), labels)
            ax.set_xlabel("decode ms per token (median, bar p10–p90; steps not kept)")
        ax.invert_yaxis()
        return to_svg(fig)


KL_LEVELS = ("0.1", "1.0", "5.0", "10.0", "median", "90.0", "95.0", "99.0", "99.9", "max")  # left to right


def kl_distribution_plot(rows: list[dict[str, Any]]) -> str | None:
    """Each variant's KL distribution over the scored positions as llama-perplexity's percentiles (log scale), the
    baseline's noise floor (its bfloat16 copy's mean KL) drawn across; None where no row recorded them."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("kl_divergence_quantiles")
          and (r.get("kl_divergence_mean") or 0) > 0]
    if not ok:
        return None
    floor = next((r["noise_floor"] for r in rows if r.get("status") == "ok" and r.get("noise_floor")), None)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for r in ok:
            q = r["kl_divergence_quantiles"]
            levels = [k for k in KL_LEVELS if k in q and q[k] > 0]
            ax.plot(range(len(levels)), [q[k] for k in levels], marker="o", markersize=3, label=r["variant"],
                    gid=f"kl-{r['variant']}")
        ax.set_yscale("log")
        ax.set_xticks(range(len(KL_LEVELS)), [k if k in ("median", "max") else f"{k}%" for k in KL_LEVELS])
        ax.set_xlabel("percentile of the positions (llama-perplexity's)")
        ax.set_ylabel("KL divergence from the baseline (nats)")
        if floor is not None and floor["kl_mean"] > 0:
            ax.axhline(floor["kl_mean"], color="#888888", linestyle="--", linewidth=1, gid="noise-floor",
                       label=f"noise floor (mean KL, {floor['path'].split(' against')[0].removeprefix('the ')})")
        ax.legend(fontsize=7, loc="upper left", frameon=False)
        return to_svg(fig)


def context_plot(rows: list[dict[str, Any]]) -> str | None:
    """Median decode ms/token against prompt length, per variant, at the first batch size; points timed on a noisy
    machine left out."""
    ok = [r for r in rows if r.get("status") == "ok" and len({p["prompt_tokens"] for p in r.get("decode_points") or []
                                                              if not p.get("noisy")}) > 1]
    if not ok:
        return None
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for r in ok:
            batch = r["decode_points"][0]["batch_size"]
            pts = sorted((p["prompt_tokens"], p["decode_ms_per_token"]) for p in r["decode_points"]
                         if p["batch_size"] == batch and not p.get("noisy"))
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", ms=3, label=f"{r['variant']} (batch {batch})")
        ax.set_xlabel("prompt tokens (context before decoding)")
        ax.set_ylabel("decode ms per token (median)")
        ax.legend(frameon=False, fontsize=7)
        return to_svg(fig)


def memory_plot(frame: pd.DataFrame) -> str | None:
    """Left: weights and KV cache (measured, stacked) with the analytic figures marked. Right, on an axis of its
    own so that it does not dwarf them: the rest of the peak (peak − weights − KV: activations, workspace and, on
    CPU, the runtime itself). The legend sits below both panels, off the bars."""
    ok = measured(frame)
    if ok.empty or "weight_bytes" not in ok:
        return None
    with plt.rc_context(STYLE):
        w = ok["weight_bytes"].astype(float) / MIB
        kv = column(ok, "kv_cache_bytes").fillna(0).astype(float) / MIB
        peak = column(ok, "peak_memory_bytes").astype(float) / MIB
        other = (peak - w - kv).clip(lower=0).fillna(0)
        ys = list(range(len(ok)))
        fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 0.42 * len(ok) + 1.9), sharey=True,
                                          gridspec_kw={"width_ratios": [3, 2]})
        left.barh(ys, w, color="#2c7fb8", label="weights")
        left.barh(ys, kv, left=w, color="#7fcdbb", label="KV cache")
        left.scatter(column(ok, "weight_bytes_analytic").astype(float) / MIB, ys, marker="|", s=220, color="black",
                     zorder=3, label="weights, analytic")
        kv_analytic = column(ok, "kv_cache_bytes_analytic").astype(float) / MIB
        left.scatter(w + kv_analytic, ys, marker="|", s=220, color="#d95f0e", zorder=3, label="+ KV, analytic")
        left.set_xlabel("MiB held by the model and its cache")
        right.barh(ys, other, color="#bbbbbb", label="rest of the peak (peak − weights − KV)")
        right.set_xlabel("rest of the generation's peak, MiB")
        left.set_yticks(ys, list(ok["variant"]))
        left.invert_yaxis()
        fig.legend(*_legend_entries(left, right), loc="lower center", ncol=5, frameon=False, fontsize=7,
                   bbox_to_anchor=(0.5, -0.02))
        fig.subplots_adjust(bottom=0.55 / (0.42 * len(ok) + 1.9) + 0.12)
        return to_svg(fig)


def _legend_entries(*axes: Any) -> tuple[list[Any], list[str]]:
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    return handles, labels
