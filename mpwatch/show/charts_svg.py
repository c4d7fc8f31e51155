"""Inline SVG charts for the HTML report: no JavaScript, no external resources.

Every text that reaches the SVG goes through :func:`html.escape`. Long series (a million steps) are
reduced to at most ``max_points`` per line by keeping each bucket's minimum and maximum, so spikes
(a loss-scale drop) stay visible.

The underflow heatmap colours on an absolute, logarithmic scale (:data:`UNDERFLOW_BINS`, the same
as the TensorBoard tab's ``static/charts.js``), so 0.35% never looks like 35%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import numpy as np

W, H = 640, 220
ML, MR, MT, MB = 64, 16, 28, 36  # margins
SKIP_COLOUR = "#d62728"

#: (upper bound, colour, label) of the underflow fraction's bins: exactly 0, then decades up to
#: 100% (fixed thresholds 0.1%, 1%, 10%); the TensorBoard tab's ``UNDERFLOW_BINS`` are the same.
UNDERFLOW_BINS = (
    (0.0, "#ffffff", "0"),
    (1e-3, "#fde0c5", "< 0.1%"),
    (1e-2, "#f9a66c", "0.1–1%"),
    (1e-1, "#e8541e", "1–10%"),
    (math.inf, "#8c1d04", "≥ 10%"),
)
NOT_PROBED = ("#dadce0", "not probed")


def underflow_bin(v: float | None) -> int:
    """The index in :data:`UNDERFLOW_BINS` of an underflow fraction; ``len(UNDERFLOW_BINS)`` for
    none (not probed).

    >>> [underflow_bin(v) for v in (0.0, 0.0005, 0.0035, 0.01, 0.5, None)]
    [0, 1, 2, 3, 4, 5]
    """
    if v is None or not math.isfinite(v):
        return len(UNDERFLOW_BINS)
    if v <= 0:
        return 0
    for i, (below, _, _) in enumerate(UNDERFLOW_BINS[1:], start=1):
        if v < below:
            return i
    return len(UNDERFLOW_BINS) - 1


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
    spans: Sequence[tuple[int, int, int]] = (),
    max_points: int = 1500,
    y_from_zero: bool = False,
    stepped: bool = False,
) -> str:
    """A line chart of one or more (name, x, y) series.

    ``marks``: x positions drawn as red lines across the plot, each exactly at its step (skipped
    steps). ``spans``: ``(first, last, count)`` ranges shaded in red, for skips whose steps are not
    known (only a cumulative count was recorded). ``stepped``: each value holds until the next
    point (the loss scale after step s is the one step s + 1 uses), so a drop is drawn at its step.
    """
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
    # the x range holds every mark and span too (a skip after the last drawable point: scale 0)
    ends = [float(v) for v in marks] + [float(v) for f, la, _ in spans for v in (f, la)]
    xmin = min([float(p[1].min()) for p in prepared] + ends)
    xmax = max([float(p[1].max()) for p in prepared] + ends)
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
            f'<text x="{ML - 4}" y="{y + 3:.1f}" text-anchor="end" class="tick ytick">'
            f"{escape(label)}</text>"
        )
    for t in _ticks(xmin, xmax):
        x = sx(t)
        parts.append(
            f'<text x="{x:.2f}" y="{MT + ph + 14}" text-anchor="middle" class="tick xtick">'
            f"{escape(_num(t))}</text>"
        )
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, (name, xa, ya) in enumerate(prepared):
        if stepped and len(xa) > 1:  # (x0, y0) (x1, y0) (x1, y1) ...
            xa = np.repeat(xa, 2)[1:]
            ya = np.repeat(ya, 2)[:-1]
        pts = " ".join(f"{sx(a):.2f},{sy(b):.1f}" for a, b in zip(xa, ya))
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
    for first, last, count in spans:
        a, b = sx(max(float(first), xmin)), sx(min(float(last), xmax))
        parts.append(
            f'<rect x="{min(a, b - 2):.2f}" y="{MT}" width="{max(2.0, b - a):.2f}" height="{ph}" '
            f'class="span" fill="{SKIP_COLOUR}" fill-opacity="0.15"><title>'
            f"{int(count)} skipped in steps {int(first)}-{int(last)} (which steps is not recorded)"
            "</title></rect>"
        )
    if len(marks):
        m = np.unique(np.asarray(marks, dtype=float))
        m = m[(m >= xmin) & (m <= xmax)]
        # one line per pixel column: markers closer than a pixel share one
        px = np.floor((m - xmin) / (xmax - xmin) * pw).astype(np.int64)
        starts = np.flatnonzero(np.diff(px, prepend=-1) != 0)
        for k, i in enumerate(starts):
            j = starts[k + 1] if k + 1 < len(starts) else len(m)
            x = sx(float(m[i]))
            what = (
                f"skipped step {int(m[i])}"
                if j - i == 1
                else f"{j - i} skipped steps, {int(m[i])}-{int(m[j - 1])}"
            )
            parts.append(
                f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{MT}" y2="{MT + ph}" class="mark" '
                f'data-step="{int(m[i])}" stroke="{SKIP_COLOUR}" stroke-width="1.5" '
                f'stroke-opacity="0.8"><title>{what}</title></line>'
            )
    if mark_label:
        parts.append(
            f'<text x="{ML + 4}" y="{MT + 12}" class="tick" style="fill:{SKIP_COLOUR}">'
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
    note: str | None = None,
    xlabel: str = "log2 |gradient|",
) -> str:
    """Bars of a log2-magnitude histogram with the representable window shaded (the figure of
    Micikevicius et al. 2017). ``note``: a line in red above the bars (why the probe's numbers do
    not hold); a window that is not finite (loss scale 0) is not drawn."""
    e = np.asarray(edges_log2, dtype=float)
    c = np.asarray(counts, dtype=float)
    if len(e) == len(c) + 1:
        lefts, rights = e[:-1], e[1:]
    elif len(e) == len(c) and len(e):
        lefts, rights = e, e + 1
    else:
        return _empty(title, chart_id, "no histogram recorded")
    if not len(c) or not (np.isfinite(c) & (c > 0)).any():
        return _empty(title, chart_id, note or "no histogram recorded")
    if window_log2 is not None and not (
        len(window_log2) == 2
        and all(isinstance(w, (int, float)) and math.isfinite(w) for w in window_log2)
    ):
        window_log2 = None
    xmin, xmax = float(lefts.min()), float(rights.max())
    if window_log2 is not None and len(window_log2) == 2:
        xmin = min(xmin, float(window_log2[0]))
        xmax = max(xmax, float(window_log2[1]))
    ymax = float(np.nanmax(c)) or 1.0
    pw, ph = W - ML - MR, H - MT - MB

    def sx(v: float) -> float:
        return ML + (v - xmin) / (xmax - xmin or 1) * pw

    parts = _frame(title, chart_id, xlabel, "count")
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
    if note:
        parts.append(
            f'<text x="{ML + 4}" y="{MT + 26}" class="tick note-line" style="fill:{SKIP_COLOUR}">'
            f"{escape(note)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


HEAT_ROW = 14  # px per layer row: every row carries its label
HEAT_LABEL_W = 200
HEAT_CELLS_W = W - HEAT_LABEL_W - MR


def heatmap_chart(
    chart_id: str,
    title: str,
    layers: Sequence[str],
    steps: Sequence[int],
    values: Sequence[Sequence[float | None]],
) -> str:
    """Layer × probe-step underflow: one labelled row per layer, cells coloured by the fixed
    thresholds of :data:`UNDERFLOW_BINS` (runs of equal colour drawn as one rectangle), and the
    legend. ``values[r][c]``: layer ``r``'s underflow fraction at ``steps[c]`` (None: not
    probed)."""
    if not len(layers) or not len(steps):
        return _empty(title, chart_id, "no probe results recorded")
    n, k = len(layers), len(steps)
    top = MT + 4
    legend_y = top + n * HEAT_ROW + 30
    height = legend_y + 20
    cw = HEAT_CELLS_W / k
    parts = [
        f'<svg class="chart heatmap" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="8" y="18" class="ct">{escape(title)}</text>',
        f'<rect x="{HEAT_LABEL_W}" y="{top}" width="{HEAT_CELLS_W}" height="{n * HEAT_ROW}" '
        'class="plot" fill="none"/>',
    ]
    colours = [c for _, c, _ in UNDERFLOW_BINS] + [NOT_PROBED[0]]
    names = [lab for _, _, lab in UNDERFLOW_BINS] + [NOT_PROBED[1]]
    for r, name in enumerate(layers):
        y = top + r * HEAT_ROW
        shown = str(name) if len(str(name)) <= 30 else str(name)[:29] + "…"
        parts.append(
            f"<g><title>{escape(str(name))}</title>"
            f'<text x="{HEAT_LABEL_W - 6}" y="{y + HEAT_ROW - 3}" text-anchor="end" '
            f'class="row-label">{escape(shown)}</text></g>'
        )
        bins = [underflow_bin(None if v is None else float(v)) for v in values[r]]
        c = 0
        while c < k:
            e = c
            while e + 1 < k and bins[e + 1] == bins[c]:
                e += 1
            vals = [values[r][i] for i in range(c, e + 1) if values[r][i] is not None]
            what = (
                names[bins[c]]
                if not vals
                else f"{min(vals):.3%}" + (f"-{max(vals):.3%}" if max(vals) != min(vals) else "")
            )
            where = f"step {steps[c]}" if c == e else f"steps {steps[c]}-{steps[e]}"
            parts.append(
                f'<rect x="{HEAT_LABEL_W + c * cw:.2f}" y="{y}" width="{(e - c + 1) * cw:.2f}" '
                f'height="{HEAT_ROW}" fill="{colours[bins[c]]}" class="cell" '
                f'data-bin="{bins[c]}"><title>{escape(str(name))}, {where}: '
                f"{escape(what)}</title></rect>"
            )
            c = e + 1
    parts.append(
        f'<text x="{HEAT_LABEL_W}" y="{top + n * HEAT_ROW + 12}" class="tick">probe step '
        f"{int(steps[0])}</text>"
    )
    if k > 1:
        parts.append(
            f'<text x="{HEAT_LABEL_W + HEAT_CELLS_W}" y="{top + n * HEAT_ROW + 12}" '
            f'text-anchor="end" class="tick">{int(steps[-1])}</text>'
        )
    x = 8.0
    parts.append(f'<text x="{x}" y="{legend_y + 10}" class="tick">underflow:</text>')
    x += 60
    for colour, label in zip(colours, names):
        parts.append(
            f'<rect x="{x:.0f}" y="{legend_y}" width="12" height="12" fill="{colour}" '
            f'stroke="#bbb" class="legend-swatch"/><text x="{x + 16:.0f}" y="{legend_y + 10}" '
            f'class="tick legend-label">{escape(label)}</text>'
        )
        x += 24 + 7 * len(label)
    parts.append("</svg>")
    return "\n".join(parts)
