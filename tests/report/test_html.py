import re
import shutil
import subprocess
from pathlib import Path

import pytest

from quantlab.report import write_report


def test_html_holds_every_variant_every_plot_and_the_evidence(hand_run: Path) -> None:
    write_report(hand_run)
    page = (hand_run / "report.html").read_text()
    for variant in ("fp32", "bf16", "int8", "int4", "int4-slow", "int2"):
        assert f">{variant}<" in page or f">{variant} ◆<" in page
    for plot in ("plot-pareto", "plot-latency", "plot-context", "plot-memory"):
        figure = re.search(rf'<figure id="{plot}"><svg.*?</svg>', page, re.S)
        assert figure, plot
    assert "UnsupportedError: no kernel for 2 bits" in page and 'class="failed"' in page
    assert "num_hidden_layers" in page and "windows: window 64" in page
    # Self-contained: no scripts, no stylesheets or images fetched from anywhere.
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_the_pareto_front_is_marked_in_table_and_caption(hand_run: Path) -> None:
    write_report(hand_run)
    page = (hand_run / "report.html").read_text()
    caption = re.search(r'<figure id="plot-pareto">.*?<figcaption>(.*?)</figcaption>', page, re.S).group(1)
    # weights + KV bytes against perplexity: int4-slow (bigger and worse than int4) and fp32 (bigger than bf16,
    # equal perplexity) are dominated.
    assert caption == "Pareto front (ringed): bf16, int8, int4"
    assert "int4-slow ◆" not in page and "int4 ◆" in page


def test_csv_and_parquet_have_one_row_per_variant_and_point(hand_run: Path) -> None:
    import pandas as pd

    write_report(hand_run)
    csv = pd.read_csv(hand_run / "results.csv")
    parquet = pd.read_parquet(hand_run / "results.parquet")
    assert len(csv) == len(parquet) == 5 * 2 + 1  # five measured variants x two points + the failed one
    assert list(csv.columns) == list(parquet.columns)
    assert "weight_bytes_ratio" in csv and "decode_ms_samples" not in csv


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_the_page_renders_in_a_headless_browser(hand_run: Path, tmp_path: Path) -> None:
    write_report(hand_run)
    url = (hand_run / "report.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0
    assert dom.stdout.count("<svg") == 4 and "int4-slow" in dom.stdout
    shot = tmp_path / "page.png"
    subprocess.run(["chromium", *flags, "--window-size=1200,3000", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 3000 and pixels.std() > 0.05  # a rendered page, not a blank one


def test_lm_eval_task_metrics_appear_with_deltas_in_both_reports(tmp_path: Path) -> None:
    from .conftest import make_row, write_run

    task = [{"task": "stdlib_continuation", "num_fewshot": 0, "limit": 40, "samples": 40, "lm_eval_version": "0.4.13"}]
    rows = [make_row("fp32", 19.0, 58.5, 4.0, lm_eval_stdlib_continuation_acc=0.494, lm_eval_tasks=task),
            make_row("int2", 2.0, 66.0, 2.0, lm_eval_stdlib_continuation_acc=0.443, lm_eval_tasks=task)]
    run = write_run(tmp_path / "run", "tasks", rows)
    md = write_report(run).read_text()
    assert "## lm-eval tasks" in md and "| int2 | 0.4430 | -0.0510 |" in md
    page = (run / "report.html").read_text()
    assert "<h2>lm-eval tasks</h2>" in page and "-0.0510" in page and "40 samples, lm-eval 0.4.13" in page


def test_every_table_scrolls_sideways_instead_of_being_clipped(hand_run: Path) -> None:
    page = (write_report(hand_run).parent / "report.html").read_text()
    assert page.count("<table") >= 3 and page.count('<div class="scroll"><table') == page.count("<table")
    assert ".scroll{overflow-x:auto" in page


PROBE = """<script>
(() => {
  const vw = document.documentElement.clientWidth, out = {width: vw, hidden: [], overflow: 0, labels: 0, overlaps: []};
  const table = document.querySelector("table.summary"), box = table.closest(".scroll");
  box.scrollLeft = 0;
  out.overflow = box.scrollWidth - box.clientWidth;  // > 0: a scrollbar would be needed to see some column
  for (const th of table.querySelectorAll("th")) {  // every summary column in view as the page opens
    const r = th.getBoundingClientRect();
    if (r.left < 0 || r.right > Math.min(vw, box.getBoundingClientRect().right) + 1 || r.width < 4)
      out.hidden.push(th.textContent);
  }
  out.columns = table.querySelectorAll("th").length;
  for (const svg of document.querySelectorAll("svg")) {
    const boxes = [...svg.querySelectorAll('g[id^="point-label-"]')].map(g => [g.id, g.getBoundingClientRect()]);
    out.labels += boxes.length;
    boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => {
      if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom) out.overlaps.push(a + "/" + b);
    }));
  }
  const pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_at_1400_px_every_summary_column_is_visible_without_scrolling_and_no_two_point_labels_overlap(
        tmp_path: Path) -> None:
    """Variants that share bytes (two formats at the same size; the KV twins of one weight format) are the case
    where labels collide; long labels, divergence columns, failures and noisy rows are the case where a summary
    table grows wide."""
    import json

    from .conftest import make_row, write_run
    from .test_headline import diverging, noisy

    rows = [make_row("bf16", 9.5, 15.40, 3.7), make_row("int8-pc-asym", 5.8, 15.44, 2.9),
            make_row("nf4-b64", 4.0, 19.74, 5.0), make_row("hqq4-g64", 4.0, 19.37, 2.4),
            noisy(make_row("int4-g64-asym", 4.0, 19.93, 2.4)), make_row("int4-g64-asym-gptq", 4.0, 19.40, 2.4),
            make_row("int3-g128-asym", 3.2, 95.25, 2.6), make_row("int3-g128-asym-gptq", 3.2, 32.31, 2.6),
            make_row("int4-g128-asym-gptq+int8-pc-asym@down_proj/kv-int4-g32-r128@llama.cpp", 4.4, 19.0, 2.5),
            make_row("int2", 0, None, 0, status="failed", error="UnsupportedError: " + "no kernel for 2 bits " * 12)]
    rows = [diverging(r, 0.01 * i, 0.1 * i) if r["status"] == "ok" else r for i, r in enumerate(rows)]
    run = write_run(tmp_path / "run", "labels", rows)
    write_report(run)
    page = run / "probe.html"
    page.write_text((run / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120)
    probe = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout).group(1).replace("&quot;", '"'))
    assert probe["width"] <= 1400 and probe["columns"] == 7  # variant, bytes, ppl, Δppl, KL, top-1, speed
    assert probe["hidden"] == [] and probe["overflow"] <= 0, probe
    assert probe["labels"] >= 8 and probe["overlaps"] == []
