"""report.html: one self-contained page (inline CSS and SVG, no scripts, no fetches) from the same data as report.md."""
from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from .headline import Headline
from .paired import floor_lines, paired_lines
from .plots import context_plot, kl_distribution_plot, latency_plot, memory_plot, noisy_left_out, pareto_plot
from .summary import Summary
from .table import (
    Section,
    Struck,
    cells,
    first_ok,
    fmt_value,
    header,
    measured,
    pareto_variants,
    point_section,
    sections,
)
from .text import export_items, gguf_note, how_obtained, kv_unread_note, machines_note, software_line

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;margin:.5em 0;font-size:13px}th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}tr.failed td{background:#fdecea}tr.base td{background:#eef6fb}
.front{font-weight:600}.note{color:#555;font-size:12.5px}figure{margin:1em 0}figcaption{color:#555;font-size:12.5px}
.banner{background:#fff4d6;border:1px solid #e5c100;padding:.5em 1em}code{background:#f4f4f4;padding:0 3px}
.answer{background:#eef6fb;border:1px solid #9cc7e4;padding:.3em 1.2em .6em}.answer li{margin:.35em 0}
td.noisy{color:#999;text-decoration:line-through}table.summary td{white-space:nowrap}table.summary td.l{white-space:normal}
sup{font-size:10px;color:#555}ol.notes{font-size:12.5px;color:#444;margin-top:0}
"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def _td(c: str, left: bool) -> str:
    """A cell (already escaped); a ``Struck`` one greyed and struck through; a full ``<td`` passed as it is."""
    if c.startswith("<td"):
        return c
    classes = " ".join(x for x in ("l" if left else "", "noisy" if isinstance(c, Struck) else "") if x)
    return f'<td class="{classes}">{c}</td>' if classes else f"<td>{c}</td>"


def html_table(header: list[str], rows: list[tuple[list[str], str]], left: int = 1, css: str = "") -> str:
    """``rows``: (cells, css class). Cells are already escaped; the first ``left`` columns align left."""
    th = "".join(f'<th class="l">{h}</th>' if i < left else f"<th>{h}</th>" for i, h in enumerate(header))
    body = []
    for row_cells, cls in rows:
        tds = "".join(_td(c, i < left) for i, c in enumerate(row_cells))
        body.append(f'<tr class="{cls}">{tds}</tr>')
    table = f'<table class="{css}">' if css else "<table>"
    return f'<div class="scroll">{table}<thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def escaped(values: list[str]) -> list[str]:
    """Cells escaped for HTML, a ``Struck`` one staying ``Struck``."""
    return [Struck(esc(v)) if isinstance(v, Struck) else esc(v) for v in values]


def _divergence_figure(frame: pd.DataFrame, baseline: str, rows: list[dict[str, Any]]) -> list[str]:
    """KL divergence from the baseline against bytes, where the run measured it."""
    plot = pareto_plot(frame, baseline, "kl_divergence_mean", "mean KL divergence from the baseline (nats)")
    if plot is None:
        return []
    on_front = [v for v, f in pareto_variants(frame, "kl_divergence_mean").items() if f]
    paired = paired_lines(frame, rows)
    listed = "".join(f"<p>{esc(line)}</p>" for line in floor_lines(rows))
    listed += f"<p>{esc(paired[0])}</p><ul>{''.join(f'<li>{esc(x)}</li>' for x in paired[1:])}</ul>" if paired else ""
    spread = _figure(kl_distribution_plot(rows), "plot-kl-distribution",
                     "KL per position: each variant's percentiles (log scale), the noise floor dashed")
    return ["<h2>Divergence against bytes</h2>",
            _figure(plot, "plot-divergence", "Pareto front (ringed): " + (", ".join(on_front) or "none")) + listed,
            spread]


def _figure(svg: str | None, ident: str, caption: str) -> str:
    if svg is None:
        return ""
    return f'<figure id="{ident}">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


def _details(frame: pd.DataFrame, baseline: str, front: dict[str, bool], section: Section) -> str:
    """Every main column of the registered measurements, a row per variant (the summary's details)."""
    rows = []
    width = len(header(section))
    for _, r in frame.iterrows():
        label = esc(r["variant"])
        if r.get("status") != "ok":
            rows.append(([label, "failed", f'<span class="l">{esc(r.get("error"))}</span>'] + [""] * (width - 1), "failed"))
            continue
        cls = "base" if r["variant"] == baseline else ""
        name = f'<span class="front">{label} ◆</span>' if front.get(r["variant"]) else label
        rows.append(([name, "ok", *escaped(cells(r.get, section))], cls))
    return html_table(["variant", "status", *(esc(h) for h in header(section))], rows)


def _breakable(label: str) -> str:
    """A variant label escaped, with line-break opportunities after / @ + (long labels wrap instead of widening)."""
    out = esc(label)
    for ch in ("/", "@", "+", ",", "["):
        out = out.replace(ch, ch + "<wbr>")
    return out


def _summary(table: Summary) -> str:
    """The summary table: variant, bytes, quality, speed; notes as numbered markers."""
    rows = []
    for r in table.rows:
        marks = "".join(f"<sup>{n}</sup>" for n in r.notes)
        name = _breakable(r.variant) + (" ◆" if r.front else "") + marks
        if r.front:
            name = f'<span class="front">{name}</span>'
        if not r.ok:
            span = len(table.headings) - 1
            rows.append(([name, f'<td class="l" colspan="{span}">failed: {esc(r.error)}</td>'], "failed"))
            continue
        body = [f'<td class="noisy" title="{esc(c.title)}">{esc(c.text)}</td>' if c.struck else
                (f'<td title="{esc(c.title)}">{esc(c.text)}</td>' if c.title else esc(c.text)) for c in r.cells]
        rows.append(([name, *body], "base" if r.baseline else ""))
    notes = "".join(f"<li>{esc(text)}.</li>" for text in table.footnotes)
    return html_table([esc(h) for h in table.headings], rows, css="summary") + (
        f'<ol class="notes">{notes}</ol>' if notes else "")


def _answer(head: Headline) -> str:
    items = "".join(f"<li><b>{esc(a.title)}</b>: {_inline(a.text)}</li>" for a in head.answers)
    return f'<section class="answer" id="answer"><h2>The answer</h2><ul>{items}</ul>' \
        f'<p class="note">Rules: {_inline(head.rule_text)}</p></section>'


def _inline(text: str) -> str:
    """A Markdown sentence of the report (bold and code spans) as HTML."""
    import re

    out = esc(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def _gap(measured_bytes: Any, predicted_bytes: Any) -> str:
    """Measured minus predicted bytes, signed; a dash where either is missing."""
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (measured_bytes, predicted_bytes)):
        return "—"
    return f"{int(measured_bytes) - int(predicted_bytes):+,}"


def _memory_table(frame: pd.DataFrame) -> str:
    rows = []
    for _, r in measured(frame).iterrows():
        get = r.get
        rows.append(([
            esc(r["variant"]), fmt_value(get("weight_bytes"), ","), fmt_value(get("weight_bytes_analytic"), ","),
            _gap(get("weight_bytes"), get("weight_bytes_analytic")), fmt_value(get("weight_bytes_estimate"), ","),
            _gap(get("weight_bytes"), get("weight_bytes_estimate")), fmt_value(get("kv_cache_bytes"), ","),
            fmt_value(get("kv_cache_bytes_analytic"), ","), _gap(get("kv_cache_bytes"), get("kv_cache_bytes_analytic")),
            fmt_value(get("peak_memory_bytes"), ","),
        ], ""))
    header = ["variant", "weights B measured", "analytic", "gap", "config estimate", "gap", "KV B measured", "analytic",
              "gap", "peak B"]
    return html_table(header, rows)


def _points(rows: list[dict[str, Any]]) -> str:
    if not any(len(r.get("decode_points") or []) > 1 for r in rows):
        return ""
    section = point_section(rows)
    body = [([esc(r["variant"]), str(p["batch_size"]), str(p["prompt_tokens"]), *escaped(cells(p.get, section, compare=False))], "")
            for r in rows if r.get("status") == "ok" for p in r.get("decode_points") or []]
    head = ["variant", "batch", "prompt tokens", *(esc(h) for h in header(section, compare=False))]
    return "<h2>Decode by batch size and context length</h2>" + html_table(head, body)


def _sections(frame: pd.DataFrame, parts: list[Section]) -> str:
    out = []
    for section in parts:
        body = [([esc(r["variant"]), *escaped(cells(r.get, section))], "") for _, r in measured(frame).iterrows()]
        out.append(f"<h2>{esc(section.heading)}</h2>" + html_table(["variant", *(esc(h) for h in header(section))], body))
    return "".join(out)


ASSUMPTIONS = [
    ("roofline bytes", "a decode step reads every weight it multiplies once (embedding tables: one row) and the whole "
     "KV cache at the mean decode length; caches and reuse are ignored"),
    ("peak memory scope", "on CPU the process's resident peak, so it includes the Python runtime and libraries; on "
     "CUDA the allocator's peak, the CUDA context excluded"),
]


def _evidence(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> str:
    ok = first_ok(rows)
    items: list[tuple[list[str], str]] = []
    for e in manifest.get("model_evidence") or []:
        items.append(([esc(e["meaning"]), esc(e["value"]), esc(e["kind"]), esc(e["source"])], ""))
    for title, text in how_obtained(rows, manifest):
        items.append(([esc(title), "", "measured" if title != "roofline" else "measured + derived", esc(text.replace("**", ""))], ""))
    for name, text in ASSUMPTIONS:
        items.append(([esc(name), "", "assumption", esc(text)], ""))
    items.append((["device", "", "environment", esc(ok.get("device", "—"))], ""))
    items.append((["software", "", "environment", esc(software_line(rows, manifest))], ""))
    return html_table(["figure", "value", "source", "where / how"], items, left=4)


def _plain(line: str) -> str:
    """A Markdown line of the text module as escaped HTML text (emphasis and code marks dropped)."""
    return esc(line.replace("**", "").replace("`", ""))


def _exports(rows: list[dict[str, Any]]) -> str:
    items = export_items(rows)
    if not items:
        return ""
    lines = "".join(f"<li><b>{esc(v)}</b> → {esc(to)}: "
                    + (f'<a href="{esc(folder)}">{esc(folder)}</a>, {esc(detail)}' if folder else esc(detail)) + "</li>"
                    for v, to, folder, detail in items)
    return f"<h2>Exports</h2><ul>{lines}</ul>"


def _latency_caption(rows: list[dict[str, Any]], what: str) -> str:
    left = noisy_left_out(rows)
    return what + (f" Left out, timed on a busy or noisy machine: {', '.join(left)}." if left else "")


def render_html(frame: pd.DataFrame, rows: list[dict[str, Any]], manifest: dict[str, Any], head: Headline,
                table: Summary, banner: str | None) -> str:
    """The whole report page."""
    recipe = manifest.get("recipe", {})
    baseline = manifest.get("baseline", "")
    front = pareto_variants(frame)
    main, *own = sections(rows)
    note = machines_note(rows)
    on_front = [v for v, f in front.items() if f]
    first = first_ok(rows)
    title = f"quantlab report: {recipe.get('name', first.get('recipe', '?'))}"
    parts = [
        f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p>{esc(recipe['description'])}</p>" if recipe.get("description") else "",
        f"<p>Model <b>{esc(first.get('model', '?'))}</b> on <b>{esc(first.get('device', '?'))}</b>; baseline "
        f"<b>{esc(baseline)}</b>; {len(rows)} variants.</p>",
        "" if manifest.get("complete", True) else
        '<p class="banner">Incomplete run: some variants have not been measured yet; run the same command to resume.</p>',
        f'<p class="banner">{_plain(note[-1])}</p>' if note else "",
        *(f'<p class="note">{_plain(line)}</p>' for line in gguf_note(manifest)[1:]),
        _answer(head),
        f'<p class="banner" id="timing-banner">{_inline(banner)}</p>' if banner else "",
        "<h2>Summary</h2>", _summary(table),
        '<p class="note">× base: ratio to the baseline row (bytes: weights + KV cache at the first decode point; speed: '
        "tokens per second). ◆: on the Pareto front of perplexity against weights + KV bytes. Hover a cell for its "
        "detail; every column of every measurement is in Details below.</p>",
        *(f'<p class="banner">{_inline(line)}</p>' for line in kv_unread_note(rows)[1:]),
        "<h2>Perplexity against bytes</h2>",
        _figure(pareto_plot(frame, baseline), "plot-pareto",
                "Pareto front (ringed): " + (", ".join(on_front) or "no variant with both figures")),
        *_divergence_figure(frame, baseline, rows),
        "<h2>Decode latency</h2>",
        _figure(latency_plot(rows), "plot-latency",
                _latency_caption(rows, "Per-token decode time at each variant's first point.")),
        _figure(context_plot(rows), "plot-context",
                _latency_caption(rows, "Median decode time per token as the context grows.")),
        "<h2>Memory</h2>",
        _figure(memory_plot(frame), "plot-memory", "Weights and KV cache as measured, with the analytic figures marked (|, black: weights; orange: weights + KV); "
                "right: the peak of the generation split into weights, KV cache and the rest."),
        _memory_table(frame),
        "<h2>Details</h2>",
        _details(frame, baseline, front, main),
        _points(rows),
        _sections(frame, own),
        _exports(rows),
        "<h2>Evidence</h2>",
        '<p class="note">Which figures the model\'s config file states, which the implementation decides, which are '
        "assumed and which were measured, on what.</p>",
        _evidence(rows, manifest),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
