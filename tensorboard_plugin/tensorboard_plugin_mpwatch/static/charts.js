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

// series: [{name, steps, values, color}]; opts: {log2, yLabel, format, markers: [steps], markerLabel}
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
    axes.appendChild(svg('line', {x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t), class: 'mpw-grid'}));
    axes.appendChild(svg('text', {x: M.left - 6, y: sy(t) + 4, 'text-anchor': 'end',
      text: opts.log2 ? `2^${t}` : (opts.percent ? pct(t) : fmt(t, 3))}));
  }
  for (const t of niceTicks(xmin, xmax, 6)) {
    axes.appendChild(svg('text', {x: sx(t), y: H - M.bottom + 16, 'text-anchor': 'middle', text: fmt(t)}));
  }
  axes.appendChild(svg('text', {x: W - M.right, y: H - 4, 'text-anchor': 'end', class: 'mpw-axis-label',
    text: 'step'}));
  if (opts.yLabel) {
    axes.appendChild(svg('text', {x: 4, y: M.top - 4, class: 'mpw-axis-label', text: opts.yLabel}));
  }
  root.appendChild(axes);

  for (const s of prepared) {
    let d = '';
    let pen = false;
    for (let i = 0; i < s.steps.length; i++) {
      const y = s.ys[i];
      if (y === null || !Number.isFinite(y)) { pen = false; continue; }
      d += `${pen ? 'L' : 'M'}${sx(s.steps[i]).toFixed(1)},${sy(y).toFixed(1)}`;
      pen = true;
    }
    root.appendChild(svg('path', {d, stroke: s.color, class: 'mpw-line'},
      svg('title', {text: s.name})));
  }

  if (opts.markers && opts.markers.length) {
    const g = svg('g', {class: 'mpw-markers'});
    const maxMarkers = 2000;
    const step = Math.max(1, Math.ceil(opts.markers.length / maxMarkers));
    for (let i = 0; i < opts.markers.length; i += step) {
      const x = sx(opts.markers[i]);
      g.appendChild(svg('line', {x1: x, x2: x, y1: M.top, y2: H - M.bottom, class: 'mpw-skip'},
        svg('title', {text: `${opts.markerLabel || 'marker'} at step ${opts.markers[i]}`})));
    }
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
  if (!hist || !hist.counts || !hist.counts.length) {
    root.appendChild(svg('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'mpw-empty',
      text: 'no histogram at this step'}));
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
    text: 'log2 |gradient| (float32 reference)'}));
  root.appendChild(axes);
  return root;
}

// Layer × probe-step heatmap of underflow on a canvas (a 1,000-layer model stays cheap).
export function heatmap(map) {
  const wrap = el('div', {class: 'mpw-heatmap'});
  const layers = map.layers || [];
  const steps = map.steps || [];
  if (!layers.length || !steps.length) {
    wrap.appendChild(el('p', {class: 'mpw-empty', text: 'no probe results yet'}));
    return wrap;
  }
  const labelW = 180;
  const width = 640;
  const rowH = Math.max(2, Math.min(16, Math.floor(480 / layers.length)));
  const height = rowH * layers.length;
  const colW = (width - labelW) / steps.length;
  const canvas = el('canvas', {width, height, class: 'mpw-heatmap-canvas',
    'aria-label': 'underflow by layer and probe step'});
  const ctx = canvas.getContext('2d');
  let vmax = 0;
  for (const row of map.values) for (const v of row) if (v !== null && v > vmax) vmax = v;
  vmax = vmax || 1;
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, width, height);
  for (let r = 0; r < layers.length; r++) {
    for (let c = 0; c < steps.length; c++) {
      const v = map.values[r][c];
      if (v === null || v === undefined) { ctx.fillStyle = '#eeeeee'; } else {
        const t = Math.sqrt(v / vmax);
        ctx.fillStyle = `rgb(${255 - Math.round(t * 38)},${255 - Math.round(t * 207)},${255 - Math.round(t * 218)})`;
      }
      ctx.fillRect(labelW + c * colW, r * rowH, Math.ceil(colW), rowH);
    }
    if (rowH >= 10) {
      ctx.fillStyle = '#333';
      ctx.font = `${Math.min(12, rowH - 1)}px sans-serif`;
      ctx.fillText(String(layers[r]).slice(0, 28), 2, r * rowH + rowH - 2);
    }
  }
  canvas.addEventListener('mousemove', (event) => {
    const box = canvas.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * width;
    const y = ((event.clientY - box.top) / box.height) * height;
    const r = Math.floor(y / rowH);
    const c = Math.floor((x - labelW) / colW);
    if (r < 0 || r >= layers.length) { hideTooltip(); return; }
    if (c < 0 || c >= steps.length) { showTooltip(event, [`layer ${layers[r]}`]); return; }
    showTooltip(event, [`layer ${layers[r]}`, `probe step ${fmt(steps[c])}`,
      `underflow ${pct(map.values[r][c])}`]);
  });
  canvas.addEventListener('mouseleave', hideTooltip);
  wrap.appendChild(canvas);
  wrap.appendChild(el('div', {class: 'mpw-caption',
    text: `${layers.length} layers × ${steps.length} probe steps; darker = more gradient underflow (max ${pct(vmax)})`}));
  return wrap;
}
