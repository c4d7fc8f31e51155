// The per-layer table: sortable, filterable, paged (a 1,000-layer model renders one page at a time).
import {el, clear, fmt, pct} from './dom.js';

const PAGE = 50;

const COLUMNS = [
  {key: 'name', label: 'layer'},
  {key: 'class', label: 'class'},
  {key: 'compute_dtype', label: 'compute'},
  {key: 'variable_dtype', label: 'variables'},
  {key: 'output_dtype', label: 'output'},
  {key: 'params', label: 'params', num: true, format: fmt},
  {key: 'underflow_fraction', label: 'underflow', num: true, format: pct},
  {key: 'grad_rel_error', label: 'grad error', num: true, format: fmt},
  {key: 'max_abs_activation', label: 'max |act|', num: true, format: fmt},
  {key: 'time_share', label: 'time share', num: true, format: pct, profiled: true},
  {key: 'tensor_core_share', label: 'Tensor Cores', num: true, format: pct, gpu: true,
    title: 'share of the layer\'s GPU time in Tensor Core kernels (by their HLO and names)'},
  {key: 'findings', label: 'findings'},
];

// The time column says what its time is: the GPU kernels' device time on a GPU trace, the
// profiled ops' time elsewhere (each op counted in its layer's dtype).
const TIME_LABELS = {
  device_kernels: ['GPU time', 'share of the GPU kernels\' device time (forward and backward)'],
  host_ops: ['time share (host ops)', 'share of the profiled host ops\' time (no GPU kernels in the trace)'],
  device_ops: ['time share (device ops)', 'share of the profiled device ops\' time'],
};

export class LayerTable {
  constructor(onSelectLayer) {
    this.onSelectLayer = onSelectLayer;
    this.sortKey = null;
    this.sortDir = 1;
    this.filter = '';
    this.page = 0;
    this.rows = [];
    this.badges = {};
    this.profiled = false;
    this.timeSource = null;
    this.input = el('input', {type: 'search', class: 'mpw-filter', placeholder: 'filter layers, classes, dtypes…',
      'aria-label': 'filter layers'});
    this.input.addEventListener('input', () => { this.filter = this.input.value.toLowerCase(); this.page = 0; this.draw(); });
    this.count = el('span', {class: 'mpw-count'});
    this.pager = el('span', {class: 'mpw-pager'});
    this.table = el('table', {class: 'mpw-table', id: 'mpw-layer-table'});
    this.root = el('div', {class: 'mpw-table-wrap'},
      el('div', {class: 'mpw-table-tools'}, this.input, this.count, this.pager), this.table);
  }

  setData(view) {
    const cols = view.columns;
    this.rows = view.rows.map((row) => {
      const obj = {};
      cols.forEach((c, i) => { obj[c] = row[i]; });
      obj.findings = (view.badges[obj.name] || []);
      return obj;
    });
    this.profiled = Boolean(view.profiled);
    this.timeSource = view.time_source || null;
    this.draw();
  }

  columns() {
    const gpu = this.timeSource === 'device_kernels';
    return COLUMNS.filter((c) => (!c.profiled || this.profiled) && (!c.gpu || gpu)).map((c) => {
      if (c.key !== 'time_share' || !TIME_LABELS[this.timeSource]) return c;
      const [label, title] = TIME_LABELS[this.timeSource];
      return {...c, label, title};
    });
  }

  visible() {
    let rows = this.rows;
    if (this.filter) {
      rows = rows.filter((r) => [r.name, r.class, r.compute_dtype, r.variable_dtype, r.output_dtype,
        ...r.findings.map((f) => f.rule)].some((v) => v !== null && v !== undefined && String(v).toLowerCase().includes(this.filter)));
    }
    if (this.sortKey) {
      const key = this.sortKey;
      const dir = this.sortDir;
      const value = (r) => (key === 'findings' ? r.findings.length : r[key]);
      rows = [...rows].sort((a, b) => {
        const va = value(a);
        const vb = value(b);
        if (va === vb) return 0;
        if (va === null || va === undefined) return 1;
        if (vb === null || vb === undefined) return -1;
        return (va < vb ? -1 : 1) * dir;
      });
    }
    return rows;
  }

  draw() {
    const rows = this.visible();
    const pages = Math.max(1, Math.ceil(rows.length / PAGE));
    this.page = Math.min(this.page, pages - 1);
    clear(this.table);
    const head = el('tr');
    for (const c of this.columns()) {
      const arrow = this.sortKey === c.key ? (this.sortDir > 0 ? ' ▲' : ' ▼') : '';
      const th = el('th', {class: c.num ? 'num sortable' : 'sortable', 'data-key': c.key, tabindex: 0,
        title: c.title ? `${c.title}; sort by ${c.label}` : `sort by ${c.label}`, text: c.label + arrow});
      const sort = () => {
        if (this.sortKey === c.key) this.sortDir = -this.sortDir;
        else { this.sortKey = c.key; this.sortDir = c.num ? -1 : 1; }
        this.draw();
      };
      th.addEventListener('click', sort);
      th.addEventListener('keydown', (e) => { if (e.key === 'Enter') sort(); });
      head.appendChild(th);
    }
    this.table.appendChild(el('thead', {}, head));
    const body = el('tbody');
    for (const r of rows.slice(this.page * PAGE, (this.page + 1) * PAGE)) {
      const tr = el('tr', {class: r.findings.length ? 'mpw-has-finding' : null});
      for (const c of this.columns()) {
        if (c.key === 'findings') {
          tr.appendChild(el('td', {}, r.findings.map((f) =>
            el('span', {class: `mpw-badge mpw-${f.severity}`, title: f.title, text: f.rule || f.severity}))));
        } else if (c.key === 'name') {
          const td = el('td', {class: 'mpw-layer-name', title: r.note || r.name});
          td.textContent = r.name;
          td.addEventListener('click', () => this.onSelectLayer && this.onSelectLayer(r.name));
          tr.appendChild(td);
        } else if (c.key === 'compute_dtype' && r.effective_dtype && r.effective_dtype !== r.compute_dtype) {
          tr.appendChild(el('td', {title: r.note || `computes in ${r.effective_dtype} inside`,
            text: `${r.compute_dtype} → ${r.effective_dtype}`}));
        } else {
          const v = r[c.key];
          tr.appendChild(el('td', {class: c.num ? 'num' : null, text: c.format ? c.format(v) : fmt(v)}));
        }
      }
      body.appendChild(tr);
    }
    this.table.appendChild(body);
    this.count.textContent = `${rows.length} of ${this.rows.length} layers`;
    clear(this.pager);
    if (pages > 1) {
      const prev = el('button', {type: 'button', text: '‹ prev', disabled: this.page === 0});
      const next = el('button', {type: 'button', text: 'next ›', disabled: this.page >= pages - 1});
      prev.addEventListener('click', () => { this.page -= 1; this.draw(); });
      next.addEventListener('click', () => { this.page += 1; this.draw(); });
      this.pager.append(prev, el('span', {text: ` page ${this.page + 1} of ${pages} `}), next);
    }
  }
}
