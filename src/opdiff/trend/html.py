"""trend.html: one self-contained page of curves for a TrendResult (inline SVG, no script, no
network; a Content-Security-Policy forbids both, and every name from a stream is escaped).

    from opdiff.trend.html import write_html
    write_html(result, target_run, golden_run, "out/trend.html")

Two runs: the loss and the global gradient norm of both, the culprit module's quantity on both,
and its relative difference, with the step where they part marked. One run: the loss, the
gradient norm and the quantity of the first alert, with every alert's step marked. Long runs
are drawn from the minimum and maximum of each pixel column, so a one-step spike stays visible.
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Optional

import numpy as np

TARGET, GOLDEN, MARK, BAND = "#c0392b", "#2471a3", "#7d3c98", "#b7950b"
WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 920, 230, 70, 20, 28, 34
MAX_POINTS = 1400


def write_html(result, target_run, golden_run=None, path="trend.html") -> Path:
    from ..report.outputs import atomic_write_text
    return atomic_write_text(Path(path), render(result, target_run, golden_run), "the trend page")


def render(result, target_run, golden_run=None) -> str:
    charts = []
    first = result.first_divergence
    rank = first.rank if first is not None else min(target_run.ranks)
    t = target_run.ranks[rank]
    g = golden_run.ranks.get(rank) if golden_run is not None else None
    marks = []
    if first is not None:
        marks.append((first.step, f"step {first.step}: the runs part"))
    for a in result.alerts:
        if a.kind in ("nan", "inf", "spike") and a.rank == rank and (a.run in (None, "target")):
            marks.append((a.step, f"step {a.step}: {a.kind}"))
    marks = marks[:12]
    for col, title, log in (("loss", "loss", False), ("grad_norm", "global gradient norm", True)):
        series = [("target", t.steps, t.series(col), TARGET)]
        if g is not None:
            series.append(("golden", g.steps, g.series(col), GOLDEN))
        charts.append(chart(title, series, marks, log=log))
    column = first.slot.column if first is not None else next(
        (a.slot.column for a in result.alerts if a.kind in ("nan", "inf", "spike")), None)
    if column is not None and column not in ("loss", "grad_norm"):
        label = first.slot.label if first is not None else column
        name = column.rpartition(":")[0] or column
        series = [("target", t.steps, t.series(column), TARGET)]
        if g is not None:
            series.append(("golden", g.steps, g.series(column), GOLDEN))
        charts.append(chart(f"{name}: {label}", series, marks, log=True))
    if first is not None and g is not None:
        from .divergence import distance_series
        steps, d = distance_series(t, g, first.slot.column)
        floor = result.ranks[rank].floor
        # Bitwise-equal steps (0) cannot sit on a log axis: draw them along its bottom.
        shown = np.where(d == 0, floor / 100, d)
        charts.append(chart(f"{first.slot.column}: relative difference target vs golden "
                            f"(equal steps drawn at {floor / 100:g})",
                            [("|target - golden| / max", steps, shown, MARK)], marks, log=True,
                            hline=(floor, f"dtype floor {floor:g}")))
    return _page(result, charts)


def _downsample(steps: np.ndarray, values: np.ndarray) -> tuple:
    ok = np.isfinite(values)
    steps, values = steps[ok], values[ok]
    n = len(steps)
    if n <= MAX_POINTS:
        return steps, values
    buckets = np.array_split(np.arange(n), MAX_POINTS // 2)
    xs, ys = [], []
    for b in buckets:
        lo, hi = b[np.argmin(values[b])], b[np.argmax(values[b])]
        for i in sorted((lo, hi)):
            xs.append(steps[i])
            ys.append(values[i])
    return np.array(xs), np.array(ys)


def step_ticks(x0: float, x1: float, most: int = 6) -> list[int]:
    """Step numbers to label an x axis from x0 to x1 with: whole steps 1, 2 or 5 times a power
    of ten apart, about `most` of them (a label at 29.4 read "29" under the step-30 marker)."""
    span = max(x1 - x0, 1.0)
    raw = span / most
    mag = 10 ** math.floor(math.log10(raw))
    gap = max(1, int(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)))
    first = math.ceil(x0 / gap) * gap
    return list(range(int(first), int(math.floor(x1)) + 1, gap))


def chart(title: str, series: list, marks: list, *, log: bool = False,
          hline: Optional[tuple] = None) -> str:
    """One SVG line chart: series [(label, steps, values, colour)], marks [(step, label)]."""
    drawn = []
    for label, steps, values, colour in series:
        x, y = _downsample(np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64))
        if log:
            keep = y > 0
            x, y = x[keep], np.log10(y[keep])
        drawn.append((label, x, y, colour))
    xs = np.concatenate([d[1] for d in drawn]) if drawn else np.array([])
    ys = np.concatenate([d[2] for d in drawn]) if drawn else np.array([])
    if hline is not None and hline[0] > 0:
        ys = np.append(ys, math.log10(hline[0]) if log else hline[0])
    head = f'<h3>{html.escape(title)}</h3>'
    if not len(xs):
        return head + '<p class="none">nothing measured</p>'
    x0, x1 = float(xs.min()), float(xs.max())
    y0, y1 = float(ys.min()), float(ys.max())
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    w, h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B
    px = lambda v: PAD_L + (v - x0) / (x1 - x0) * w
    py = lambda v: PAD_T + (1 - (v - y0) / (y1 - y0)) * h
    out = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
           f'role="img" aria-label="{html.escape(title, quote=True)}">',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{w}" height="{h}" class="plot"/>']
    for k in range(5):
        v = y0 + (y1 - y0) * k / 4
        text = f"{10 ** v:.3g}" if log else f"{v:.4g}"
        out.append(f'<line x1="{PAD_L}" x2="{PAD_L + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                   f'class="grid"/><text x="{PAD_L - 6}" y="{py(v) + 4:.1f}" '
                   f'class="tick" text-anchor="end">{text}</text>')
    for v in step_ticks(x0, x1):     # whole steps, each label under its own step
        out.append(f'<text x="{px(v):.1f}" y="{HEIGHT - 12}" class="tick" '
                   f'text-anchor="middle">{v}</text>')
    if hline is not None and hline[0] > 0:
        v = math.log10(hline[0]) if log else hline[0]
        out.append(f'<line x1="{PAD_L}" x2="{PAD_L + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                   f'stroke="{BAND}" stroke-dasharray="6 4"><title>{html.escape(hline[1])}'
                   f'</title></line>')
    for step, label in marks:
        if x0 <= step <= x1:
            out.append(f'<line x1="{px(step):.1f}" x2="{px(step):.1f}" y1="{PAD_T}" '
                       f'y2="{PAD_T + h}" stroke="{MARK}" stroke-width="1.5" '
                       f'stroke-dasharray="3 3"><title>{html.escape(label)}</title></line>')
    # Golden wide and pale underneath, target thin on top: where they agree, both show.
    for label, x, y, colour in sorted(drawn, key=lambda d: d[0] != "golden"):
        if not len(x):
            continue
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x, y))
        width, opacity = ("3.5", "0.45") if label == "golden" else ("1.4", "1")
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                   f'stroke-width="{width}" stroke-opacity="{opacity}"><title>'
                   f'{html.escape(label)}</title></polyline>')
    legend = " ".join(f'<span style="color:{c}">&#9632; {html.escape(name)}</span>'
                      for name, _, _, c in drawn)
    out.append("</svg>")
    return head + f'<div class="legend">{legend}</div>' + "".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:20px} h3{font-size:15px;margin:22px 0 4px} .verdict{font-size:15px;padding:10px 14px;
border-left:4px solid #7d3c98;background:#f6f2f9} .ok{border-color:#229954;background:#eef8f1}
table{border-collapse:collapse;font-size:13px;margin-top:8px} td,th{border:1px solid #ddd;
padding:3px 8px;text-align:left} .plot{fill:#fbfbfb;stroke:#ccc} .grid{stroke:#eee}
.tick{font-size:11px;fill:#666} .legend{font-size:12px} .none{color:#888} code{font-size:12px}
"""


def _page(result, charts: list) -> str:
    esc = html.escape
    ok = result.first_divergence is None and not result.problems
    rows = []
    if result.first_divergence is not None:
        d = result.first_divergence.to_dict()
        rows.append(("first divergence", f"step {d['step']}, rank {d['rank']}, {d['module']} "
                     f"({d['phase']}, {d['quantity']})"))
    for a in result.alerts[:20]:
        who = f"{a.run}: " if a.run else ""
        rows.append((f"{who}{a.kind} at step {a.step}", a.reason))
    for e in result.environment_diff[:12]:
        rows.append(("environment", f"{e.get('key')}: {e.get('target')} vs {e.get('golden')}"))
    table = "".join(f"<tr><th>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>" for k, v in rows)
    runs = f"target {esc(result.target)}" + (f", golden {esc(result.golden)}" if result.golden else "")
    nd = result.files.get("next_dump.json")
    nd_html = (f"<p>Op by op, on each side: <code>opdiff.PrecisionDebugger(config_path="
               f"'{esc(nd)}', dump_path='./dump/&lt;side&gt;')</code>, then "
               f"<code>opdiff compare</code>.</p>" if nd else "")
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'\">"
        f"<title>opdiff trend</title><style>{_CSS}</style></head><body>"
        f"<h1>opdiff trend</h1><p>{runs}</p>"
        f"<div class=\"verdict{' ok' if ok else ''}\">{esc(result.message)}</div>"
        f"{nd_html}<table>{table}</table>{''.join(charts)}</body></html>\n")
