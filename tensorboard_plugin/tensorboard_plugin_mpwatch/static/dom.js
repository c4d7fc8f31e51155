// DOM helpers. Every user string (run, tag, layer name) goes through textContent or setAttribute:
// no HTML strings anywhere in the tab.

export const SVG_NS = 'http://www.w3.org/2000/svg';

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'text') node.textContent = String(value);
    else if (key === 'class') node.setAttribute('class', value);
    else if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2), value);
    } else node.setAttribute(key, String(value));
  }
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(typeof child === 'string' || typeof child === 'number'
      ? document.createTextNode(String(child)) : child);
  }
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

// A tooltip element shared by the charts and the heatmap (values on hover).
let tooltip = null;
export function showTooltip(event, lines) {
  if (!tooltip) {
    tooltip = el('div', {class: 'mpw-tooltip', role: 'tooltip'});
    document.body.appendChild(tooltip);
  }
  clear(tooltip);
  for (const line of lines) tooltip.appendChild(el('div', {text: line}));
  tooltip.style.display = 'block';
  const pad = 12;
  let x = event.clientX + pad;
  let y = event.clientY + pad;
  const rect = tooltip.getBoundingClientRect();
  if (x + rect.width > window.innerWidth) x = event.clientX - rect.width - pad;
  if (y + rect.height > window.innerHeight) y = event.clientY - rect.height - pad;
  tooltip.style.left = `${Math.max(0, x)}px`;
  tooltip.style.top = `${Math.max(0, y)}px`;
}

export function hideTooltip() {
  if (tooltip) tooltip.style.display = 'none';
}

export function fmt(value, digits = 4) {
  if (value === null || value === undefined) return '—';
  if (typeof value === 'boolean') return value ? 'yes' : 'no';
  if (typeof value !== 'number') return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return value.toLocaleString('en-US');
  if (value === 0) return '0';
  const abs = Math.abs(value);
  if (abs >= 1e5 || abs < 1e-3) return value.toExponential(2);
  return String(Number(value.toPrecision(digits)));
}

export function pct(value) {
  if (value === null || value === undefined) return '—';
  const p = value * 100;
  if (p === 0) return '0%';
  if (Math.abs(p) < 0.01) return `${p.toExponential(1)}%`;
  return `${Number(p.toPrecision(3))}%`;
}
