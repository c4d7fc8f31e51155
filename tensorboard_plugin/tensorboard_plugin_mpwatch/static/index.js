// The "Mixed Precision" tab. TensorBoard loads this module in its plugin iframe
// (/data/plugin_entry.html?name=mpwatch, base href plugin/mpwatch/) and calls render().
import {el, clear, fmt, pct} from './dom.js';
import {lineChart, legend, histogramChart, heatmap, COLORS} from './charts.js';
import {LayerTable} from './table.js';

const T = {
  lossScale: 'mpwatch/loss_scale',
  zero: 'mpwatch/grad/zero_fraction',
  subnormal: 'mpwatch/grad/subnormal_fraction',
  nonfinite: 'mpwatch/grad/nonfinite_count',
  underflow: 'mpwatch/probe/underflow_fraction',
  headroom: 'mpwatch/grad/headroom_bits',
  stepTime: 'mpwatch/perf/step_time_ms',
};
const DEFAULT_RELOAD_MS = 30000;

const state = {run: null, runs: [], probeStep: null, loading: null, again: false};
const ui = {};

async function getJson(path, params = {}) {
  const query = new URLSearchParams(params).toString();
  const response = await fetch(query ? `${path}?${query}` : path, {credentials: 'same-origin'});
  const body = await response.json();
  if (!response.ok) throw new Error(body && body.error ? body.error : `${path}: HTTP ${response.status}`);
  return body;
}

function section(title, id, ...children) {
  return el('section', {class: 'mpw-section', id}, el('h2', {text: title}), ...children);
}

function layout() {
  const link = el('link', {rel: 'stylesheet', href: './static/style.css'});
  document.head.appendChild(link);
  document.title = 'Mixed Precision';
  ui.runSelect = el('select', {id: 'mpw-run', 'aria-label': 'run'});
  ui.runSelect.addEventListener('change', () => {
    state.run = ui.runSelect.value;
    state.probeStep = null;
    refresh();
  });
  ui.status = el('span', {class: 'mpw-status', id: 'mpw-status', text: 'loading…'});
  ui.facts = el('div', {class: 'mpw-facts', id: 'mpw-facts'});
  ui.findings = el('div', {id: 'mpw-findings'});
  ui.lossScale = el('div', {id: 'mpw-loss-scale'});
  ui.health = el('div', {id: 'mpw-health'});
  ui.probeSelect = el('select', {id: 'mpw-probe-step', 'aria-label': 'probe step'});
  ui.probeSelect.addEventListener('change', () => {
    state.probeStep = Number(ui.probeSelect.value);
    loadProbe();
  });
  ui.histogram = el('div', {id: 'mpw-histogram'});
  ui.probeFacts = el('div', {class: 'mpw-facts'});
  ui.heatmap = el('div', {id: 'mpw-heatmap'});
  ui.profile = el('div', {id: 'mpw-profile'});
  ui.float8 = el('div', {id: 'mpw-float8'});
  ui.float8Section = section('Float8 readiness', 'mpw-float8-section', ui.float8);
  ui.memory = el('div', {id: 'mpw-memory'});
  ui.memorySection = section('Memory by dtype', 'mpw-memory-section', ui.memory);
  ui.profileSection = section('Profile', 'mpw-profile-section', ui.profile);
  ui.table = new LayerTable((name) => { ui.table.input.value = name; ui.table.filter = name.toLowerCase(); ui.table.draw(); });
  ui.main = el('main', {class: 'mpw-main'},
    el('header', {class: 'mpw-header'},
      el('h1', {text: 'Mixed Precision'}),
      el('label', {}, 'Run ', ui.runSelect),
      ui.status),
    ui.facts,
    section('Findings', 'mpw-findings-section', ui.findings),
    el('div', {class: 'mpw-grid'},
      section('Loss scale (log2) and skipped steps', 'mpw-loss-scale-section', ui.lossScale),
      section('Gradient health and underflow', 'mpw-health-section', ui.health),
      section('Gradient magnitudes vs the float16 window', 'mpw-histogram-section',
        el('label', {}, 'Probe step ', ui.probeSelect), ui.histogram, ui.probeFacts),
      section('Underflow by layer and probe step', 'mpw-heatmap-section', ui.heatmap)),
    ui.profileSection,
    ui.float8Section,
    ui.memorySection,
    section('Layers', 'mpw-layers-section', ui.table.root));
  document.body.appendChild(ui.main);
}

function setRuns(runs) {
  state.runs = runs;
  const names = runs.map((r) => r.name);
  if (!names.includes(state.run)) state.run = names.length ? names[0] : null;
  const current = Array.from(ui.runSelect.options).map((o) => o.value);
  if (current.join('\u0000') !== names.join('\u0000')) {
    clear(ui.runSelect);
    for (const name of names) ui.runSelect.appendChild(el('option', {value: name, text: name}));
  }
  if (state.run !== null) ui.runSelect.value = state.run;
}

function renderFacts(findings) {
  clear(ui.facts);
  const info = findings.info || {};
  const ls = info.loss_scale || {};
  const device = info.device || {};
  const facts = [
    ['policy', info.policy],
    ['loss scale', ls.kind ? `${ls.kind}${ls.reason ? ` (${ls.reason})` : ''}` : null],
    ['device', device.name || device.type],
    ['model', info.model ? `${info.model.name} (${fmt(info.model.params)} params)` : null],
  ].filter(([, v]) => v !== null && v !== undefined);
  for (const [k, v] of facts) ui.facts.appendChild(el('span', {class: 'mpw-fact'}, el('b', {text: `${k}: `}), String(v)));
  for (const n of findings.notices || []) {
    ui.facts.appendChild(el('div', {class: `mpw-notice mpw-${n.level || 'info'}`,
      text: `${n.part}: ${n.message}`}));
  }
  for (const e of findings.errors || []) {
    ui.facts.appendChild(el('div', {class: 'mpw-notice mpw-error mpw-read-error', text: `reading: ${e}`}));
  }
}

// A table of text cells from the server ({columns, rows}): nothing is formatted here.
export function textTable(table, cls) {
  return el('table', {class: `mpw-text-table ${cls}`},
    el('thead', {}, el('tr', {}, table.columns.map((c) => el('th', {text: c})))),
    el('tbody', {}, table.rows.map((row) => el('tr', {}, row.map((c) => el('td', {text: c}))))));
}

function renderMemory(memory) {
  clear(ui.memory);
  ui.memorySection.hidden = !memory;
  if (!memory) return;
  for (const line of memory.lines) ui.memory.appendChild(el('p', {class: 'mpw-memory-line', text: line}));
  ui.memory.appendChild(textTable(memory.dtype_table, 'mpw-memory-by-dtype'));
  ui.memory.appendChild(textTable(memory.policy_table, 'mpw-memory-by-policy'));
}

function renderFloat8(view) {
  clear(ui.float8);
  ui.float8Section.hidden = !view;
  if (!view) return;
  ui.float8.appendChild(el('p', {class: 'mpw-float8-line',
    text: `probe at step ${view.step}: ${view.ready} of ${view.total} Dense/EinsumDense layers ready for float8 (errors against float32, beside ${view.mode})`}));
  ui.float8.appendChild(textTable(view, 'mpw-float8-layers'));
}

function renderFindings(view) {
  clear(ui.findings);
  if (view.note) ui.findings.appendChild(el('p', {class: 'mpw-empty', text: view.note}));
  if (!view.findings.length && !view.note) {
    ui.findings.appendChild(el('p', {class: 'mpw-ok', text: 'No findings: mixed precision looks healthy.'}));
  }
  for (const f of view.findings) {
    const card = el('article', {class: `mpw-finding mpw-${f.severity}`, 'data-rule': f.rule},
      el('div', {class: 'mpw-finding-head'},
        el('span', {class: `mpw-badge mpw-${f.severity}`, text: f.severity}),
        el('strong', {text: f.title}),
        f.layer ? el('span', {class: 'mpw-finding-layer', text: `layer ${f.layer}`}) : null),
      f.evidence ? el('p', {class: 'mpw-evidence', text: f.evidence}) : null,
      f.why ? el('p', {class: 'mpw-why', text: f.why}) : null,
      f.fix ? el('pre', {class: 'mpw-fix'}, el('code', {text: f.fix})) : null);
    ui.findings.appendChild(card);
  }
}

function series(view, tag, name, color) {
  const s = view.series[tag];
  return s ? {name, steps: s.steps, values: s.values, color} : null;
}

function renderScalars(view) {
  clear(ui.lossScale);
  const ls = series(view, T.lossScale, 'loss scale', COLORS[0]);
  const spans = view.skipped_spans || [];
  ui.lossScale.appendChild(lineChart(ls ? [ls] : [], {log2: true, title: 'loss scale', stepped: true,
    markers: view.skipped_steps, spans, markerLabel: 'skipped step', format: (v) => fmt(v)}));
  let marked = '';
  if (spans.length) {
    marked = '; which steps is not recorded (no mpwatch/step_skipped): the spans holding them are shaded';
  } else if (view.skipped_total) {
    marked = view.skipped_marked_all === false
      ? `; ${fmt(view.skipped_steps.length)} of them marked in red (TensorBoard served a sample)`
      : ', each marked in red at its step';
  }
  // the scales as the server writes them (mpwatch.words: the CLI's spelling)
  const said = view.loss_scale_text || {};
  const first = ls && ls.steps.length ? `loss scale ${said.first ?? fmt(ls.values[0])} from step ${fmt(ls.steps[0])}` : null;
  ui.lossScale.appendChild(el('div', {class: 'mpw-caption', id: 'mpw-loss-scale-caption',
    text: `${fmt(view.skipped_total)} skipped step(s)${marked}` +
      (ls ? `; ${first}, last ${said.last ?? fmt(ls.values[ls.values.length - 1])}` : '') +
      (ls && ls.steps[0] === 0 ? ' (step 0: the scale before the first step)' : '')}));
  clear(ui.health);
  const parts = [
    series(view, T.zero, 'zero fraction (g·S)', COLORS[1]),
    series(view, T.subnormal, 'subnormal fraction (g·S)', COLORS[2]),
    series(view, T.underflow, 'probe underflow vs float32', COLORS[5]),
  ].filter(Boolean);
  ui.health.appendChild(lineChart(parts, {percent: true, yMin: 0, title: 'gradient health', format: pct}));
  ui.health.appendChild(legend(parts));
}

function renderProbes(view) {
  clear(ui.probeSelect);
  const unreliable = new Set(view.unreliable_steps || []);
  for (const s of view.steps) {
    ui.probeSelect.appendChild(el('option', {value: s, text: `step ${s}${unreliable.has(s) ? ' (unreliable)' : ''}`}));
  }
  if (view.probe) ui.probeSelect.value = String(view.probe.step);
  renderProbe(view.probe);
  // a reload with the same heatmap keeps it (and where the user scrolled it); a new one keeps the
  // scroll position too
  const key = `${state.run}\u0000${JSON.stringify(view.heatmap)}`;
  if (key === ui.heatmapKey) return;
  ui.heatmapKey = key;
  const old = ui.heatmap.querySelector('.mpw-heatmap-scroll');
  const top = old && ui.heatmapRun === state.run ? old.scrollTop : 0;
  clear(ui.heatmap);
  ui.heatmap.appendChild(heatmap(view.heatmap));
  ui.heatmapRun = state.run;
  const fresh = ui.heatmap.querySelector('.mpw-heatmap-scroll');
  if (fresh && top) fresh.scrollTop = top;
}

// Why this probe's underflow and recommended scale mean nothing, or null when they do: gradients
// that were not finite (an overflow in the forward or backward pass), or a loss scale of 0.
function probeNotMeasured(probe) {
  const m = probe.model || {};
  const reasons = [];
  if (m.nonfinite > 0 || m.first_nonfinite_layer) {
    const details = [];
    if (m.nonfinite > 0) details.push(`${fmt(m.nonfinite)}${m.size ? ` of ${fmt(m.size)}` : ''} elements inf or NaN`);
    if (m.first_nonfinite_layer === 'loss') details.push('first in the loss');
    else if (m.first_nonfinite_layer) details.push(`first at layer ${m.first_nonfinite_layer}`);
    reasons.push(`the gradients were not finite at this probe${details.length ? ` (${details.join(', ')})` : ''}`);
  }
  if (probe.mode !== 'bfloat16' && probe.loss_scale === 0) {
    reasons.push('the loss scale had fallen to 0, so every scaled gradient is 0 or NaN');
  }
  return reasons.length ? reasons : null;
}

function renderProbe(probe) {
  clear(ui.histogram);
  clear(ui.probeFacts);
  if (!probe) {
    ui.histogram.appendChild(el('p', {class: 'mpw-empty', text: 'no probe results yet'}));
    return;
  }
  const notMeasured = probeNotMeasured(probe);
  ui.histogram.appendChild(histogramChart(probe.histogram));
  const m = probe.model || {};
  const unmeasured = 'not measured';
  const said = probe.text || {};  // the numbers as the server writes them (mpwatch.words)
  const facts = [
    ['mode', probe.mode],
    ['loss scale', said.loss_scale ?? fmt(probe.loss_scale)],
    ['underflow', notMeasured ? unmeasured : said.underflow ?? pct(m.underflow_fraction)],
    ['grad error', notMeasured ? unmeasured : said.grad_error ?? fmt(m.grad_rel_error)],
    ['max |activation|', said.max_abs_activation ?? fmt(m.max_abs_activation)],
    // a fact about this probe's gradients (its largest scale with headroom below overflow), not
    // the advice: the findings weigh every probe, the skipped steps and Keras' dynamic rule
    [`largest safe scale (${fmt(m.margin_bits ?? 4)} doublings headroom)`,
      notMeasured ? 'none' : said.recommended_scale ?? fmt(probe.recommended_scale)],
  ];
  for (const [k, v] of facts) ui.probeFacts.appendChild(el('span', {class: 'mpw-fact'}, el('b', {text: `${k}: `}), v));
  if (notMeasured) {
    const said = notMeasured.join('; ');
    const text = `${said.charAt(0).toUpperCase()}${said.slice(1)}. Underflow and gradient error are not ` +
      'measured and no loss scale is recommended from this probe.';
    ui.probeFacts.appendChild(el('div', {class: 'mpw-notice mpw-error mpw-not-finite', text}));
  }
  if (probe.reliable === false) {
    ui.probeFacts.appendChild(el('div', {class: 'mpw-notice mpw-error mpw-unreliable',
      text: `Unreliable probe: ${probe.unreliable_reason || 'its loss disagreed with the train step\'s'}. ` +
        'No finding rests on it.'}));
  }
  if (probe.reference_note) ui.probeFacts.appendChild(el('div', {class: 'mpw-notice', text: probe.reference_note}));
}

// The colour of each precision in the profile's bar (unknown: grey, never counted as 16-bit).
const PRECISION_COLORS = {
  float16: '#1a73e8', bfloat16: '#12b5cb', float8: '#9334e6', int8: '#188038',
  tf32: '#e8710a', float32: '#d93025', mixed: '#f9ab00', integer: '#795548', unknown: '#bdc1c6',
};

function fact(cls, label, value, title) {
  return el('span', {class: `mpw-fact ${cls}`, title}, el('b', {text: `${label}: `}), value);
}

function renderProfile(view) {
  clear(ui.profile);
  const s = view && view.summary;
  ui.profileSection.hidden = !s;
  if (!s) return;
  const steps = Array.isArray(s.steps) && s.steps.length === 2 ? `steps ${s.steps[0]}-${s.steps[1]}` : 'profiled';
  ui.profile.appendChild(el('div', {class: 'mpw-caption mpw-profile-source', 'data-source': s.source,
    text: `${steps}: ${s.label}`}));
  if (s.trace_text) ui.profile.appendChild(el('div', {class: 'mpw-caption mpw-profile-trace', text: s.trace_text}));
  const said = s.text || {};  // the figures as the server writes them (mpwatch.words)
  const share = (key) => said[key] ?? pct(s[key]);
  const time = said.total ?? `${fmt(s.total_us / 1000)} ms`;
  const facts = el('div', {class: 'mpw-facts'});
  ui.profile.appendChild(facts);
  if (s.source !== 'device_kernels') {
    facts.append(
      fact('mpw-time', 'op time', time),
      fact('mpw-share16', '16-bit (by layer dtype)', share('share_16bit')),
      fact('mpw-cast', 'Cast ops', share('cast_share')),
      fact('mpw-outside', 'outside layers', share('unattributed_share')));
    if (s.unjoined_math_share >= s.unjoined_said) {
      facts.append(fact('mpw-unjoined', 'matmul/conv joined to no layer', share('unjoined_math_share'),
        'a model\'s math the join could not place (a train step\'s own computation): its precision not read, counted 32-bit'));
    }
    return;
  }
  // mpwatch's reading of the kernel names beside xprof's own flag, and why they differ
  facts.append(
    fact('mpw-tc-mpwatch', 'Tensor Cores (HLO and kernel names, mpwatch)', share('tensor_core_share'),
      'share of GPU time in Tensor Core kernels: by the HLO each runs (operand types, the GPU), else by its name (docs/kernels.md)'),
    fact('mpw-tc-xprof', 'Tensor Cores (xprof\'s "Kernel uses TensorCore")', share('xprof_tensor_core_share'),
      'the Profile tab\'s kernel_stats column: a substring match against a list of Volta/Turing-era names'),
    fact('mpw-unknown', 'unknown precision', share('unknown_share'), 'never counted as 16-bit'),
    fact('mpw-time', 'GPU time', time),
    fact('mpw-outside', 'outside layers', share('unattributed_share')));
  if (s.tensor_core_missed_by_xprof_share > 0) {
    ui.profile.appendChild(el('div', {class: 'mpw-caption mpw-tc-why',
      text: `The two differ by ${share('tensor_core_missed_by_xprof_share')} of GPU time: kernels whose names ` +
        'say Tensor Core (sm80_/sm90_xmma, cuBLAS nvjet, CUTLASS tensorop/half_t) that xprof\'s name list ' +
        'does not hold.'}));
  }
  const bar = el('div', {class: 'mpw-precision-bar', role: 'img', 'aria-label': 'GPU time by precision'});
  const legendBox = el('div', {class: 'mpw-legend mpw-precision-legend'});
  for (const [precision, share] of Object.entries(s.by_precision_share || {})) {
    if (!(share > 0)) continue;
    const color = PRECISION_COLORS[precision] || '#5f6368';
    const label = `${precision} ${pct(share)}${precision === 'unknown' ? ' (never counted as 16-bit)' : ''}`;
    const seg = el('div', {class: 'mpw-seg', 'data-precision': precision, 'data-share': share, title: label});
    seg.style.width = `${100 * share}%`;
    seg.style.background = color;
    bar.appendChild(seg);
    const swatch = el('span', {class: 'mpw-swatch mpw-swatch-box'});
    swatch.style.background = color;
    legendBox.appendChild(el('span', {class: 'mpw-legend-item'}, swatch, label));
  }
  ui.profile.append(bar, legendBox);
}

async function loadProbe() {
  const run = state.run;
  const view = await getJson('probes', {run, step: state.probeStep});
  if (run === state.run) renderProbe(view.probe);
}

async function refresh() {
  if (state.loading) {
    state.again = true;  // the run or the data changed while loading: load once more after
    return state.loading;
  }
  state.loading = (async () => {
    try {
      const {runs} = await getJson('runs');
      setRuns(runs);
      if (state.run === null) {
        ui.status.textContent = 'No mpwatch data in this logdir yet: add mpwatch.MixedPrecisionMonitor to model.fit.';
        document.body.dataset.state = 'empty';
        return;
      }
      const run = state.run;
      const chosenStep = state.probeStep;
      const [scalars, layers, probes, findings, profile, chosen] = await Promise.all([
        getJson('scalars', {run}),
        getJson('layers', {run}),
        getJson('probes', {run}),
        getJson('findings', {run}),
        getJson('profile', {run}),
        chosenStep === null ? null : getJson('probes', {run, step: chosenStep}).catch(() => null),
      ]);
      if (chosen && chosen.probe) probes.probe = chosen.probe;
      else state.probeStep = null;
      if (run !== state.run) return;
      renderFacts(findings);
      renderFindings(findings);
      renderMemory(findings.memory);
      renderFloat8(findings.float8);
      renderScalars(scalars);
      renderProbes(probes);
      renderProfile(profile);
      ui.table.setData(layers);
      const entry = runs.find((r) => r.name === run);
      ui.status.textContent = `step ${fmt(entry ? entry.max_step : null)} · updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.run = run;
      document.body.dataset.state = 'ready';
      if (!performance.getEntriesByName('mpwatch-rendered').length) performance.mark('mpwatch-rendered');
    } catch (error) {
      ui.status.textContent = `Could not load: ${error.message}`;
      document.body.dataset.state = 'error';
    }
  })();
  try {
    return await state.loading;
  } finally {
    state.loading = null;
    if (state.again) {
      state.again = false;
      refresh();
    }
  }
}

// Follow TensorBoard's reload: when TensorBoard's reload button spins (a manual click or its
// auto-reload timer) re-fetch; also poll at TensorBoard's reload period as a fallback.
function followReload() {
  let period = DEFAULT_RELOAD_MS;
  let enabled = true;
  try {
    const settings = JSON.parse(window.localStorage.getItem('_tb_global_settings') || '{}');
    if (typeof settings.reloadPeriodInMs === 'number') period = Math.max(30000, settings.reloadPeriodInMs);
    if (typeof settings.autoReload === 'boolean') enabled = settings.autoReload;
  } catch (e) { /* defaults */ }
  let watched = null;
  try {
    const parentDoc = window.parent !== window ? window.parent.document : null;
    if (parentDoc) {
      const watch = () => {
        const button = parentDoc.querySelector('app-header-reload .reload-button, .reload-button');
        if (!button || button === watched) return;
        watched = button;
        new MutationObserver(() => { if (button.classList.contains('loading')) refresh(); })
          .observe(button, {attributes: true, attributeFilter: ['class']});
        button.addEventListener('click', () => refresh());
      };
      watch();
      setInterval(watch, 5000);
    }
  } catch (e) { /* parent not reachable: polling only */ }
  setInterval(() => {
    if (enabled && !watched && document.visibilityState !== 'hidden') refresh();
  }, period);
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') refresh();
  });
}

export async function render() {
  layout();
  followReload();
  await refresh();
}
