// SVG charts and a canvas heatmap, hand-written (no library, nothing fetched from outside).
import {svg, el, fmt, pct, showTooltip, hideTooltip} from './dom.js';

const W = 640;
const H = 240;
const M = {top: 16, right: 16, bottom: 32, left: 64};
export const COLORS = ['#1a73e8', '#e8710a', '#12b5cb', '#9334e6', '#188038', '#d93025'];

function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const span = hi - lo;
  const step0 = Math.pow(10, Math.floor(Math.log10(span / count)));
  const err = span / count / step0;
  const step = step0 * (err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

function bisect(steps, x) {
  let lo = 0;
  let hi = steps.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (steps[mid] < x) lo = mid + 1; else hi = mid;
  }
  if (lo > 0 && Math.abs(steps[lo - 1] - x) < Math.abs(steps[lo] - x)) return lo - 1;
  return lo;
}

// series: [{name, steps, values, color}]; opts: {log2, yLabel, format, stepped, markers: [steps],
// spans: [[first, last, count]], markerLabel}
export function lineChart(series, opts = {}) {
  const transform = opts.log2 ? (v) => (v > 0 ? Math.log2(v) : null) : (v) => v;
  const format = opts.format || fmt;
  let xmin = Infinity;
  let xmax = -Infinity;
  let ymin = Infinity;
  let ymax = -Infinity;
  const prepared = series.filter((s) => s.steps.length).map((s, i) => {
    const ys = s.values.map((v) => (v === null ? null : transform(v)));
    xmin = Math.min(xmin, s.steps[0]);
    xmax = Math.max(xmax, s.steps[s.steps.length - 1]);
    for (const y of ys) if (y !== null && Number.isFinite(y)) { ymin = Math.min(ymin, y); ymax = Math.max(ymax, y); }
    return {...s, ys, color: s.color || COLORS[i % COLORS.length]};
  });
  const root = svg('svg', {class: 'mpw-chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
    'aria-label': opts.title || 'chart'});
  if (!prepared.length || !Number.isFinite(ymin)) {
    root.appendChild(svg('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'mpw-empty',
      text: 'no data yet'}));
    return root;
  }
  if (opts.yMin !== undefined) ymin = Math.min(ymin, opts.yMin);
  if (opts.yMax !== undefined) ymax = Math.max(ymax, opts.yMax);
  if (ymax === ymin) { ymax += 1; ymin -= opts.log2 ? 1 : 0; }
  if (xmax === xmin) xmax = xmin + 1;
  const sx = (x) => M.left + ((x - xmin) / (xmax - xmin)) * (W - M.left - M.right);
  const sy = (y) => H - M.bottom - ((y - ymin) / (ymax - ymin)) * (H - M.top - M.bottom);

  const axes = svg('g', {class: 'mpw-axes'});
  const yt = opts.log2
    ? niceTicks(Math.floor(ymin), Math.ceil(ymax)).filter((t) => Number.isInteger(t))
    : niceTicks(ymin, ymax);
  for (const t of yt) {
    if (t < ymin - 1e-9 || t > ymax + 1e-9) continue;
    axes.appendChild(svg('line', {x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t), class: 'mpw-gridline'}));
    axes.appendChild(svg('text', {x: M.left - 6, y: sy(t) + 4, 'text-anchor': 'end', class: 'mpw-ytick',
      text: opts.log2 ? `2^${t}` : (opts.percent ? pct(t) : fmt(t, 3))}));
  }
  for (const t of niceTicks(xmin, xmax, 6)) {
    axes.appendChild(svg('text', {x: sx(t), y: H - M.bottom + 16, 'text-anchor': 'middle', class: 'mpw-xtick',
      text: fmt(t)}));
  }
  axes.appendChild(svg('text', {x: W - M.right, y: H - 4, 'text-anchor': 'end', class: 'mpw-axis-label',
    text: 'step'}));
  if (opts.yLabel) {
    axes.appendChild(svg('text', {x: 4, y: M.top - 4, class: 'mpw-axis-label', text: opts.yLabel}));
  }
  root.appendChild(axes);

  for (const s of prepared) {
    // opts.stepped: a value holds from its step to the next one (the loss scale after step s is the
    // one step s + 1 uses), so a drop is drawn at the step that caused it
    let d = '';
    let pen = false;
    let lastY = null;
    for (let i = 0; i < s.steps.length; i++) {
      const y = s.ys[i];
      if (y === null || !Number.isFinite(y)) { pen = false; continue; }
      const px = sx(s.steps[i]).toFixed(1);
      const py = sy(y).toFixed(1);
      if (pen && opts.stepped) d += `H${px}` + (py === lastY ? '' : `V${py}`);
      else d += `${pen ? 'L' : 'M'}${px},${py}`;
      pen = true;
      lastY = py;
    }
    root.appendChild(svg('path', {d, stroke: s.color, class: 'mpw-line'},
      svg('title', {text: s.name})));
  }

  if (opts.spans && opts.spans.length) {
    // skips known only from a cumulative count: the steps between two recorded counts, shaded
    const g = svg('g', {class: 'mpw-spans'});
    for (const [a, b, k] of opts.spans) {
      const x0 = sx(Math.max(xmin, a));
      const x1 = sx(Math.min(xmax, b));
      g.appendChild(svg('rect', {x: Math.min(x0, x1 - 2), y: M.top, width: Math.max(2, x1 - x0),
        height: H - M.top - M.bottom, class: 'mpw-skip-span', 'data-first': a, 'data-last': b},
        svg('title', {text: `${fmt(k)} ${opts.markerLabel || 'marker'}(s) in steps ${fmt(a)}–${fmt(b)}` +
          ' (which steps is not recorded)'})));
    }
    root.appendChild(g);
  }
  const marked = new Set();
  if (opts.markers && opts.markers.length) {
    // one line per marked step at its exact x; markers closer than a pixel share one line
    const g = svg('g', {class: 'mpw-markers'});
    let lastPx = null;
    let line = null;
    let inLine = [];
    const close = () => {
      if (!line) return;
      line.appendChild(svg('title', {text: inLine.length === 1
        ? `${opts.markerLabel || 'marker'} at step ${fmt(inLine[0])}`
        : `${fmt(inLine.length)} ${opts.markerLabel || 'marker'}s, steps ${fmt(inLine[0])}–${fmt(inLine[inLine.length - 1])}`}));
      line.setAttribute('data-count', String(inLine.length));
    };
    for (const step of opts.markers) {
      if (step < xmin || step > xmax) continue;
      marked.add(step);
      const x = sx(step);
      if (lastPx !== null && Math.abs(x - lastPx) < 1) { inLine.push(step); continue; }
      close();
      line = svg('line', {x1: x.toFixed(2), x2: x.toFixed(2), y1: M.top, y2: H - M.bottom, class: 'mpw-skip',
        'data-step': step});
      inLine = [step];
      lastPx = x;
      g.appendChild(line);
    }
    close();
    root.appendChild(g);
  }

  // hover: crosshair and the values of every series at the nearest step
  const cross = svg('line', {y1: M.top, y2: H - M.bottom, class: 'mpw-cross', visibility: 'hidden'});
  root.appendChild(cross);
  const overlay = svg('rect', {x: M.left, y: M.top, width: W - M.left - M.right,
    height: H - M.top - M.bottom, class: 'mpw-overlay'});
  overlay.addEventListener('mousemove', (event) => {
    const box = root.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * W;
    const x = xmin + ((px - M.left) / (W - M.left - M.right)) * (xmax - xmin);
    const lines = [];
    let nearest = null;
    for (const s of prepared) {
      const i = bisect(s.steps, x);
      nearest = nearest === null ? s.steps[i] : nearest;
      lines.push(`${s.name}: ${format(s.values[i])} (step ${fmt(s.steps[i])})`);
    }
    if (nearest !== null && marked.has(nearest)) lines.push(`step ${fmt(nearest)}: ${opts.markerLabel || 'marker'}`);
    if (nearest !== null) {
      cross.setAttribute('x1', sx(nearest));
      cross.setAttribute('x2', sx(nearest));
      cross.setAttribute('visibility', 'visible');
    }
    showTooltip(event, lines);
  });
  overlay.addEventListener('mouseleave', () => { cross.setAttribute('visibility', 'hidden'); hideTooltip(); });
  root.appendChild(overlay);
  return root;
}

export function legend(series) {
  return el('div', {class: 'mpw-legend'}, series.map((s, i) =>
    el('span', {class: 'mpw-legend-item'}, swatch(s.color || COLORS[i % COLORS.length]),
      el('span', {text: s.name}))));
}

function swatch(color) {
  const node = el('span', {class: 'mpw-swatch'});
  node.style.background = color;  // CSSOM, not a style attribute (Content-Security-Policy)
  return node;
}

// The log2-magnitude histogram of reference gradients with the float16 window [lo, hi] shaded.
export function histogramChart(hist) {
  const root = svg('svg', {class: 'mpw-chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
    'aria-label': 'log2 histogram'});
  if (!hist || !hist.counts || !hist.counts.length || !hist.counts.some((c) => c > 0)) {
    root.appendChild(svg('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'mpw-empty',
      text: hist && hist.counts && hist.counts.length ? 'no finite nonzero gradient value at this step'
        : 'no histogram at this step'}));
    return root;
  }
  const edges = hist.edges_log2;
  const counts = hist.counts;
  const win = hist.window_log2 || [null, null];
  let xmin = edges[0];
  let xmax = edges[edges.length - 1];
  if (win[0] !== null) xmin = Math.min(xmin, win[0] - 1);
  if (win[1] !== null) xmax = Math.max(xmax, win[1] + 1);
  const cmax = Math.max(1, ...counts);
  const sx = (x) => M.left + ((x - xmin) / (xmax - xmin)) * (W - M.left - M.right);
  const sy = (c) => H - M.bottom - (c / cmax) * (H - M.top - M.bottom);
  if (win[0] !== null && win[1] !== null) {
    root.appendChild(svg('rect', {x: sx(win[0]), y: M.top, width: Math.max(1, sx(win[1]) - sx(win[0])),
      height: H - M.top - M.bottom, class: 'mpw-window'},
      svg('title', {text: `float16 window at this loss scale: 2^${fmt(win[0], 3)} … 2^${fmt(win[1], 3)}`})));
  }
  const g = svg('g');
  for (let i = 0; i < counts.length; i++) {
    const x0 = sx(edges[i]);
    const x1 = sx(edges[i + 1] !== undefined ? edges[i + 1] : edges[i] + 1);
    const outside = win[0] !== null && edges[i + 1] <= win[0];
    g.appendChild(svg('rect', {x: x0, y: sy(counts[i]), width: Math.max(0.5, x1 - x0 - 0.5),
      height: H - M.bottom - sy(counts[i]), class: outside ? 'mpw-bar mpw-bar-lost' : 'mpw-bar'},
      svg('title', {text: `|g| in [2^${fmt(edges[i], 3)}, 2^${fmt(edges[i + 1], 3)}): ${fmt(counts[i])}` +
        (outside ? ' (underflows in float16)' : '')})));
  }
  root.appendChild(g);
  const axes = svg('g', {class: 'mpw-axes'});
  for (const t of niceTicks(xmin, xmax, 8)) {
    axes.appendChild(svg('text', {x: sx(t), y: H - M.bottom + 16, 'text-anchor': 'middle', text: `2^${fmt(t, 3)}`}));
  }
  for (const t of niceTicks(0, cmax, 4)) {
    axes.appendChild(svg('text', {x: M.left - 6, y: sy(t) + 4, 'text-anchor': 'end', text: fmt(t, 3)}));
  }
  axes.appendChild(svg('text', {x: W - M.right, y: H - 4, 'text-anchor': 'end', class: 'mpw-axis-label',
    text: hist.source === 'mixed_unscaled' ? 'log2 |gradient| (mixed, unscaled: no float32 reference)'
      : 'log2 |gradient| (float32 reference)'}));
  root.appendChild(axes);
  return root;
}

// Underflow colours on an absolute, logarithmic scale: fixed thresholds (0, 0.1%, 1%, 10%, 100%),
// the same in every run, so 0.35% never looks like 35%. mpwatch/show/charts_svg.py uses the same.
export const UNDERFLOW_BINS = [
  {below: 0, color: '#ffffff', label: '0'},
  {below: 1e-3, color: '#fde0c5', label: '< 0.1%'},
  {below: 1e-2, color: '#f9a66c', label: '0.1–1%'},
  {below: 1e-1, color: '#e8541e', label: '1–10%'},
  {below: Infinity, color: '#8c1d04', label: '≥ 10%'},
];
export const NOT_PROBED = {color: '#dadce0', label: 'not probed'};

export function underflowBin(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return NOT_PROBED;
  if (v <= 0) return UNDERFLOW_BINS[0];
  for (const bin of UNDERFLOW_BINS.slice(1)) if (v < bin.below) return bin;
  return UNDERFLOW_BINS[UNDERFLOW_BINS.length - 1];
}

export function underflowLegend() {
  return el('div', {class: 'mpw-legend mpw-heatmap-legend', 'aria-label': 'underflow colour scale'},
    el('span', {text: 'underflow:'}),
    [...UNDERFLOW_BINS, NOT_PROBED].map((bin) => el('span', {class: 'mpw-legend-item'},
      boxSwatch(bin.color), el('span', {text: bin.label}))));
}

function boxSwatch(color) {
  const node = el('span', {class: 'mpw-swatch mpw-swatch-box'});
  node.style.background = color;
  return node;
}

const HEATMAP_ROW_PX = 14;  // every row tall enough for its label
const HEATMAP_CHUNK = 1000;  // rows per canvas (a canvas is limited in height)

// Layer × probe-step heatmap of underflow: one labelled row per layer (the panel scrolls), the
// cells on canvases (one pixel per cell, scaled up), coloured on the absolute scale above.
export function heatmap(map) {
  const wrap = el('div', {class: 'mpw-heatmap'});
  const layers = (map && map.layers) || [];
  const steps = (map && map.steps) || [];
  if (!layers.length || !steps.length) {
    wrap.appendChild(el('p', {class: 'mpw-empty', text: 'no probe results yet'}));
    return wrap;
  }
  const labels = el('div', {class: 'mpw-heatmap-labels'});
  const cells = el('div', {class: 'mpw-heatmap-cells'});
  for (let r = 0; r < layers.length; r++) {
    const label = el('div', {class: 'mpw-heatmap-label', title: String(layers[r]), text: String(layers[r]),
      'data-row': r});
    label.style.height = `${HEATMAP_ROW_PX}px`;
    labels.appendChild(label);
  }
  for (let first = 0; first < layers.length; first += HEATMAP_CHUNK) {
    const rows = Math.min(HEATMAP_CHUNK, layers.length - first);
    const canvas = el('canvas', {width: steps.length, height: rows, class: 'mpw-heatmap-canvas',
      'aria-label': `underflow by layer and probe step, layers ${first + 1}–${first + rows}`});
    canvas.style.height = `${rows * HEATMAP_ROW_PX}px`;
    const ctx = canvas.getContext('2d');
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < steps.length; c++) {
        ctx.fillStyle = underflowBin(map.values[first + r][c]).color;
        ctx.fillRect(c, r, 1, 1);
      }
    }
    canvas.addEventListener('mousemove', (event) => {
      const box = canvas.getBoundingClientRect();
      const r = first + Math.floor(((event.clientY - box.top) / box.height) * rows);
      const c = Math.floor(((event.clientX - box.left) / box.width) * steps.length);
      if (r < first || r >= first + rows || c < 0 || c >= steps.length) { hideTooltip(); return; }
      const v = map.values[r][c];
      showTooltip(event, [`layer ${layers[r]}`, `probe step ${fmt(steps[c])}`,
        v === null || v === undefined ? 'not probed' : `underflow ${pct(v)}`]);
    });
    canvas.addEventListener('mouseleave', hideTooltip);
    cells.appendChild(canvas);
  }
  const body = el('div', {class: 'mpw-heatmap-body'}, labels, cells);
  wrap.appendChild(el('div', {class: 'mpw-heatmap-scroll', tabindex: 0}, body));
  wrap.appendChild(el('div', {class: 'mpw-heatmap-axis'},
    el('span', {text: `probe step ${fmt(steps[0])}`}),
    steps.length > 1 ? el('span', {text: `${fmt(steps[steps.length - 1])}`}) : null));
  wrap.appendChild(underflowLegend());
  let vmax = null;
  for (const row of map.values) for (const v of row) if (v !== null && (vmax === null || v > vmax)) vmax = v;
  wrap.appendChild(el('div', {class: 'mpw-caption',
    text: `${fmt(layers.length)} layers × ${fmt(steps.length)} probe steps. Colour: the share of a layer's ` +
      `nonzero float32-reference gradient values that are zero in the mixed-precision gradient ` +
      `(largest here ${pct(vmax)}).`}));
  return wrap;
}
