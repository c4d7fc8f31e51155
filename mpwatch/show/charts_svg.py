"""Inline SVG charts for the HTML report: no JavaScript, no external resources.

Every text that reaches the SVG goes through :func:`html.escape`. Long series (a million steps) are
reduced to at most ``max_points`` per line by keeping each bucket's minimum and maximum, so spikes
(a loss-scale drop) stay visible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import numpy as np

W, H = 640, 220
ML, MR, MT, MB = 64, 16, 28, 36  # margins


def _reduce(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max_points // 2
    edges = np.linspace(0, n, buckets + 1).astype(int)
    xs, ys = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        if b <= a:
            continue
        seg = y[a:b]
        finite = np.isfinite(seg)
        if not finite.any():
            continue
        i_min = a + int(np.nanargmin(np.where(finite, seg, np.inf)))
        i_max = a + int(np.nanargmax(np.where(finite, seg, -np.inf)))
        for i in sorted({i_min, i_max}):
            xs.append(x[i])
            ys.append(y[i])
    return np.asarray(xs), np.asarray(ys)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + 1e-9 * step and len(out) < 20:
        out.append(v)
        v += step
    return out


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.0e}"
    return f"{v:g}"


def _frame(title: str, chart_id: str, xlabel: str, ylabel: str) -> list[str]:
    return [
        f'<svg class="chart" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{ML}" y="18" class="ct">{escape(title)}</text>',
        f'<text x="{ML + (W - ML - MR) / 2:.0f}" y="{H - 4}" class="al" '
        f'text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="12" y="{MT + (H - MT - MB) / 2:.0f}" class="al" text-anchor="middle" '
        f'transform="rotate(-90 12 {MT + (H - MT - MB) / 2:.0f})">{escape(ylabel)}</text>',
    ]


def _empty(title: str, chart_id: str, message: str) -> str:
    parts = _frame(title, chart_id, "", "")
    parts.append(
        f'<text x="{W / 2:.0f}" y="{H / 2:.0f}" text-anchor="middle" class="empty">'
        f"{escape(message)}</text></svg>"
    )
    return "\n".join(parts)


def line_chart(
    chart_id: str,
    title: str,
    series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
    *,
    xlabel: str = "step",
    ylabel: str = "",
    log2_y: bool = False,
    marks: Sequence[float] = (),
    mark_label: str = "",
    max_points: int = 1500,
    y_from_zero: bool = False,
) -> str:
    """A line chart of one or more (name, x, y) series; ``marks`` are x positions drawn as red
    ticks along the bottom (skipped steps)."""
    prepared = []
    for name, x, y in series:
        xa = np.asarray(x, dtype=float)
        ya = np.asarray(y, dtype=float)
        if log2_y:
            with np.errstate(divide="ignore", invalid="ignore"):
                ya = np.where(ya > 0, np.log2(np.where(ya > 0, ya, 1.0)), np.nan)
        ok = np.isfinite(xa) & np.isfinite(ya)
        xa, ya = _reduce(xa[ok], ya[ok], max_points)
        if len(xa):
            prepared.append((name, xa, ya))
    if not prepared:
        return _empty(title, chart_id, "no data recorded")
    xmin = min(float(p[1].min()) for p in prepared)
    xmax = max(float(p[1].max()) for p in prepared)
    ymin = min(float(p[2].min()) for p in prepared)
    ymax = max(float(p[2].max()) for p in prepared)
    if y_from_zero and not log2_y:
        ymin = min(ymin, 0.0)
    if xmax == xmin:
        xmax = xmin + 1
    if ymax == ymin:
        ymin, ymax = ymin - 1, ymax + 1
    pw, ph = W - ML - MR, H - MT - MB

    def sx(v: float) -> float:
        return ML + (v - xmin) / (xmax - xmin) * pw

    def sy(v: float) -> float:
        return MT + ph - (v - ymin) / (ymax - ymin) * ph

    parts = _frame(title, chart_id, xlabel, ylabel + (" (log2)" if log2_y else ""))
    parts.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="plot" fill="none"/>')
    for t in _ticks(ymin, ymax):
        y = sy(t)
        label = f"2^{t:g}" if log2_y else _num(t)
        parts.append(f'<line x1="{ML}" x2="{ML + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{ML - 4}" y="{y + 3:.1f}" text-anchor="end" class="tick">'
            f"{escape(label)}</text>"
        )
    for t in _ticks(xmin, xmax):
        x = sx(t)
        parts.append(
            f'<text x="{x:.1f}" y="{MT + ph + 14}" text-anchor="middle" class="tick">'
            f"{escape(_num(t))}</text>"
        )
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, (name, xa, ya) in enumerate(prepared):
        pts = " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in zip(xa, ya))
        c = colours[i % len(colours)]
        if len(xa) == 1:
            parts.append(
                f'<circle cx="{sx(xa[0]):.1f}" cy="{sy(ya[0]):.1f}" r="3" fill="{c}" '
                f'class="series"><title>{escape(name)}</title></circle>'
            )
        else:
            parts.append(
                f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.5" '
                f'class="series"><title>{escape(name)}</title></polyline>'
            )
        if len(prepared) > 1:
            parts.append(
                f'<text x="{ML + pw - 4}" y="{MT + 12 + 12 * i}" text-anchor="end" '
                f'style="fill:{c}" class="tick">{escape(name)}</text>'
            )
    if len(marks):
        m = np.asarray(marks, dtype=float)
        m = m[(m >= xmin) & (m <= xmax)]
        if len(m) > max_points:
            px = np.unique(np.round((m - xmin) / (xmax - xmin) * pw))  # one tick per pixel
            m = xmin + px / pw * (xmax - xmin)
        for v in m:
            x = sx(float(v))
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT + ph - 8}" y2="{MT + ph}" '
                'class="mark" stroke="#d62728"/>'
            )
        if mark_label:
            parts.append(
                f'<text x="{ML + 4}" y="{MT + ph - 10}" class="tick" style="fill:#d62728">'
                f"{escape(mark_label)}</text>"
            )
    parts.append("</svg>")
    return "\n".join(parts)


def histogram_chart(
    chart_id: str,
    title: str,
    edges_log2: Sequence[float],
    counts: Sequence[float],
    window_log2: Sequence[float] | None,
    zeros: int | None = None,
) -> str:
    """Bars of a log2-magnitude histogram with the representable window shaded (the figure of
    Micikevicius et al. 2017)."""
    e = np.asarray(edges_log2, dtype=float)
    c = np.asarray(counts, dtype=float)
    if len(e) == len(c) + 1:
        lefts, rights = e[:-1], e[1:]
    elif len(e) == len(c) and len(e):
        lefts, rights = e, e + 1
    else:
        return _empty(title, chart_id, "no histogram recorded")
    if not len(c) or not np.isfinite(c).any():
        return _empty(title, chart_id, "no histogram recorded")
    xmin, xmax = float(lefts.min()), float(rights.max())
    if window_log2 is not None and len(window_log2) == 2:
        xmin = min(xmin, float(window_log2[0]))
        xmax = max(xmax, float(window_log2[1]))
    ymax = float(np.nanmax(c)) or 1.0
    pw, ph = W - ML - MR, H - MT - MB

    def sx(v: float) -> float:
        return ML + (v - xmin) / (xmax - xmin or 1) * pw

    parts = _frame(title, chart_id, "log2 |gradient|", "count")
    parts.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="plot" fill="none"/>')
    if window_log2 is not None and len(window_log2) == 2:
        a, b = sx(float(window_log2[0])), sx(float(window_log2[1]))
        parts.append(
            f'<rect x="{a:.1f}" y="{MT}" width="{max(0.0, b - a):.1f}" height="{ph}" '
            'class="window" fill="#2ca02c" fill-opacity="0.12">'
            "<title>float16 window at the loss scale used</title></rect>"
        )
        parts.append(
            f'<text x="{a + 3:.1f}" y="{MT + 12}" class="tick" style="fill:#2ca02c">'
            "float16 window</text>"
        )
    for lft, rgt, cnt in zip(lefts, rights, c):
        if not np.isfinite(cnt) or cnt <= 0:
            continue
        x0, x1 = sx(float(lft)), sx(float(rgt))
        h = cnt / ymax * ph
        parts.append(
            f'<rect x="{x0:.1f}" y="{MT + ph - h:.1f}" width="{max(0.5, x1 - x0 - 0.5):.1f}" '
            f'height="{h:.1f}" class="bar" fill="#1f77b4"><title>2^{lft:g}..2^{rgt:g}: '
            f"{int(cnt)}</title></rect>"
        )
    for t in _ticks(xmin, xmax, 8):
        parts.append(
            f'<text x="{sx(t):.1f}" y="{MT + ph + 14}" text-anchor="middle" class="tick">'
            f"{escape(f'{t:g}')}</text>"
        )
    if zeros:
        parts.append(
            f'<text x="{ML + pw - 4}" y="{MT + 12}" text-anchor="end" class="tick">'
            f"exact zeros: {int(zeros)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
