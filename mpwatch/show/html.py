"""The self-contained HTML report: one file, inline CSS and SVG, no JavaScript, nothing fetched.

Every user-controlled string (run, layer and tag names, messages) goes through :func:`html.escape`.
Numbers come from the :class:`mpwatch.read.Run`'s accessors and :mod:`mpwatch.show.summary`; this
module does not import :mod:`mpwatch.show.report` (``render(..., "html")`` calls
:func:`render_html`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch._version import __version__
from mpwatch.judge import SEVERITIES, Finding
from mpwatch.read import Run
from mpwatch.show.charts_svg import heatmap_chart, histogram_chart, line_chart
from mpwatch.show.summary import (
    loss_scales_words,
    no_data_words,
    no_findings,
    own_time_words,
    probe_not_measured,
    profile_lines,
    profile_summary,
    reader_notes,
    run_summary,
    step_range,
    trace_only,
    unreadable,
)
from mpwatch.show.views import (
    float8_html,
    loss_scale_series,
    memory_html,
    skip_marks,
    underflow_heatmap,
)
from mpwatch.words import TRACE_ONLY, amount, duration_ms, loss_scale, number, percent

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;
background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
.counts span{display:inline-block;margin-right:12px;font-weight:600}
.sev-error{color:#b00020}.sev-warning{color:#a15c00}.sev-info{color:#0b5d8a}
.finding{background:#fff;border:1px solid #e3e3e3;border-left:4px solid #999;border-radius:4px;
padding:8px 12px;margin:8px 0}
.finding.error{border-left-color:#b00020}.finding.warning{border-left-color:#e08a00}
.finding.info{border-left-color:#2b8cc4}
.finding .meta{color:#666;font-size:12px}
pre{background:#f3f3f3;padding:8px;border-radius:4px;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:12px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.flag-error td{background:#fde8ea}tr.flag-warning td{background:#fff4e0}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{background:#fff;border:1px solid #e3e3e3;border-radius:4px;max-width:100%;height:auto}
svg .ct{font-size:13px;font-weight:600}svg .al,svg .tick{font-size:10px;fill:#555}
svg .grid{stroke:#eee}svg .plot{stroke:#ccc}svg .empty{font-size:12px;fill:#888}
svg line.mark{stroke:#d62728;stroke-width:1.5;stroke-opacity:.8}
svg .row-label{font:11px ui-monospace,Menlo,Consolas,monospace;fill:#333}
.heatmap-scroll{max-height:560px;overflow-y:auto;border:1px solid #e3e3e3;border-radius:4px;
background:#fff;max-width:100%}
.heatmap-scroll svg.chart{border:0}
.note{color:#666}
"""


def _fmt(v: Any, column: str = "") -> str:
    """A table cell in words (:mod:`mpwatch.words`): by its column, a duration (``*_us``,
    ``*_ms``: the unit is the column's) as an amount, a share (``*fraction``, ``*share``,
    ``*rel_error``) as a percent, a loss scale as ``2^k (v)``, any other number plainly; empty for
    a value not recorded."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return ""
        if column.endswith(("_us", "_ms")):
            return amount(v)
        if column.endswith(("fraction", "share", "rel_error")):
            return percent(v)
        if "scale" in column:
            return loss_scale(v)
        return number(v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return str(v)


def _words(say: Callable[[float], str], v: float | None) -> str | None:
    """``v`` in words (:mod:`mpwatch.words`), None when not recorded."""
    return None if v is None else say(v)


def _finding_html(f: Finding) -> str:
    loc = f"run {f.run}" + (f" · layer {f.layer}" if f.layer else "")
    parts = [
        f'<div class="finding {escape(f.severity)}" data-rule="{escape(f.rule)}">',
        f'<div><strong class="sev-{escape(f.severity)}">{escape(f.severity.upper())}</strong> '
        f"{escape(f.title)}</div>",
        f'<div class="meta">{escape(loc)} · rule {escape(f.rule)}</div>',
        f"<div>{escape(f.evidence)}</div>",
    ]
    if f.fix:
        parts.append(f"<pre><code>{escape(f.fix)}</code></pre>")
    if f.why:
        parts.append(f'<div class="note">{escape(f.why)} <em>Source: {escape(f.source)}</em></div>')
    parts.append("</div>")
    return "\n".join(parts)


def _layer_table(run: Run, findings: Sequence[Finding]) -> str:
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return '<p class="note">No layer table recorded.</p>'
    base_cols = [c for c in ("name", "class", "policy", "compute_dtype", "output_dtype",
                             "effective_dtype", "params", "tc_aligned", "is_output")
                 if c in lt]  # fmt: skip
    table = lt[base_cols].copy()
    probe_cols: list[str] = []
    probe = run.latest_probe()
    if probe is not None and len(probe.layers) and "layer" in probe.layers:
        last = probe.layers
        probe_cols = [c for c in ("underflow_fraction", "output_rel_error", "max_abs_activation",
                                  "activation_headroom_bits") if c in last]  # fmt: skip
        table = table.merge(
            last[["layer", *probe_cols]].rename(columns={"layer": "name"}), on="name", how="left"
        )
    prof_cols: list[str] = []
    if run.profile_source == "device_kernels":  # a GPU trace: the kernels' device time
        pl = run.profile_kernel_layers
        if len(pl):
            prof_cols = ["time_us", "tensor_core_share"]
            table = table.merge(
                pl[["layer", *prof_cols]].rename(columns={"layer": "name"}), on="name", how="left"
            )
    else:
        pl = run.profile_layers
        if len(pl) and "layer" in pl and "time_us" in pl:
            prof_cols = ["time_us"]
            table = table.merge(
                pl[["layer", "time_us"]].rename(columns={"layer": "name"}), on="name", how="left"
            )
    worst: dict[str, str] = {}
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    for f in findings:
        if f.layer and (f.layer not in worst or rank[f.severity] > rank[worst[f.layer]]):
            worst[f.layer] = f.severity
    cols = [*base_cols, *probe_cols, *prof_cols]
    out = ['<table class="layers"><thead><tr>']
    out += [f"<th>{escape(c)}</th>" for c in cols] + ["<th>finding</th></tr></thead><tbody>"]
    for _, row in table.iterrows():
        name = str(row["name"])
        sev = worst.get(name)
        cls = f' class="flag-{escape(sev)}"' if sev in ("error", "warning") else ""
        out.append(f"<tr{cls}>")
        for c in cols:
            v = row[c]
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            out.append(f"<td{' class=num' if num else ''}>{escape(_fmt(v, c))}</td>")
        out.append(f"<td>{escape(sev or '')}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _heatmap(run: Run, idx: int) -> str:
    """Underflow by layer and probe step (:func:`mpwatch.show.views.underflow_heatmap`), every
    layer row labelled, on the absolute colour scale."""
    view = underflow_heatmap(run)
    title = "Underflow by layer and probe step"
    if not view["layers"]:
        return heatmap_chart(f"heatmap-{idx}", title, [], [], [])
    chart = heatmap_chart(f"heatmap-{idx}", title, view["layers"], view["steps"], view["values"])
    return f'<div class="heatmap-scroll">{chart}</div>'


def _charts(run: Run, idx: int) -> str:
    charts = []
    ls = loss_scale_series(run)
    marks, spans = skip_marks(run)
    skipped = sum(k for _, _, k in spans) if spans else len(marks)
    label = ""
    if marks:
        label = f"{len(marks)} skipped (red lines: each at its step)"
    elif spans:
        label = f"{skipped} skipped (shaded: steps not recorded)"
    charts.append(
        line_chart(
            f"loss-scale-{idx}",
            "Loss scale from the first step (red: skipped steps)",
            [("loss scale", ls.index.to_numpy(), ls.to_numpy())],
            ylabel="loss scale",
            log2_y=True,
            marks=marks,
            spans=spans,
            mark_label=label,
            stepped=True,
        )
    )
    series = []
    pm = run.probe_model
    if len(pm) and "underflow_fraction" in pm:
        p = pm.sort_values("step")
        uf = pd.to_numeric(p["underflow_fraction"], errors="coerce").to_numpy()
        series.append(("probe underflow fraction", p["step"].to_numpy(), uf))
    sub = run.scalar(contract.GRAD_SUBNORMAL_FRACTION)
    if len(sub):
        series.append(("subnormal share of scaled grads", sub.index.to_numpy(), sub.to_numpy()))
    charts.append(
        line_chart(
            f"underflow-{idx}",
            "Gradient underflow over time",
            series,
            ylabel="fraction",
            y_from_zero=True,
        )
    )
    probe = run.latest_probe()
    if probe is not None and probe.histogram is not None:
        h = probe.histogram
        reference = h.get("source") != "mixed_unscaled"
        whose = "reference" if reference else "mixed (unscaled, no reference)"
        not_measured = probe_not_measured(probe.model)
        charts.append(
            histogram_chart(
                f"histogram-{idx}",
                f"log2 |{whose} gradient| at step {probe.step}, float16 window at the scale used",
                h.get("edges_log2") or [],
                h.get("counts") or [],
                h.get("window_log2"),
                h.get("zeros"),
                note=(
                    f"{not_measured[0].upper()}{not_measured[1:]}: no underflow measured, "
                    "no loss scale recommended"
                    if not_measured
                    else None
                ),
                xlabel=f"log2 |gradient| ({'float32 reference' if reference else 'mixed'})",
            )
        )
    else:
        charts.append(
            histogram_chart(
                f"histogram-{idx}", "log2 |reference gradient| (no probe)", [], [], None
            )
        )
    charts.append(_heatmap(run, idx))
    return '<div class="charts">' + "\n".join(charts) + "</div>"


def _no_data_run(r: Run, i: int, mine: list[Finding]) -> list[str]:
    """A run without mpwatch data: nothing, unless a finding says what of it could not be
    read."""
    if not mine:
        return []
    could = " could be read" if unreadable(mine) else ""
    return [
        f'<section class="run" id="run-{i}"><h2>Run {escape(r.name)}</h2>',
        f"<p>No mpwatch data{could}.</p>",
        *(f'<p class="note">reader: {escape(w)}</p>' for w in reader_notes(r)),
        "<h3>Findings</h3>",
        *(_finding_html(f) for f in mine),
        "</section>",
    ]


def render_html(runs: list[Run], findings: Sequence[Finding], logdir: str | None = None) -> str:
    where = logdir or (runs[0].path if runs else "")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    body = [
        f"<h1>mpwatch diagnosis of {escape(where)}</h1>",
        '<p class="counts">'
        + "".join(
            f'<span class="sev-{s}" id="count-{s}">{counts[s]} {s}</span>'
            for s in ("error", "warning", "info")
        )
        + "</p>",
    ]
    if not any(r.has_data for r in runs):
        body.append(f'<p id="no-data">{escape(no_data_words(findings, where))}</p>')
    for i, r in enumerate(runs):
        if not r.has_data:
            body += _no_data_run(r, i, [f for f in findings if f.run == r.name])
            continue
        st, sm = step_range(r), run_summary(r)
        body.append(f'<section class="run" id="run-{i}"><h2>Run {escape(r.name)}</h2>')
        facts = {
            "recorded": TRACE_ONLY if trace_only(r) else None,
            "policy": r.info.get("policy"),
            "device": (r.info.get("device") or {}).get("name"),
            "steps": f"{st['first']}-{st['last']}" if st["count"] else None,
            "final loss scale": _words(loss_scale, sm["final_loss_scale"])
            if not sm["loss_scales"]
            else loss_scales_words(sm["loss_scales"], loss_scale),
            "skipped steps": sm["skipped_steps"],
            "probes": sm["probes"],
            "latest underflow fraction": _words(percent, sm["underflow_fraction"]),
            # a fact about the probe's gradients, not the advice (the findings weigh the evidence)
            "largest safe scale (latest probe)": _words(loss_scale, sm["recommended_scale"]),
        }
        probe = r.latest_probe()
        not_measured = probe_not_measured(probe.model) if probe is not None else None
        if not_measured:  # the probe's own underflow and recommendation do not hold
            at = f"step {probe.step}"
            facts["latest underflow fraction"] = f"not measured at {at}: {not_measured}"
            facts["largest safe scale (latest probe)"] = f"none (not measured at {at})"
        facts |= {
            "median step time": _words(duration_ms, sm["step_time_ms"]),
            "peak memory (MiB)": sm["peak_memory_mb"],
            "mpwatch's own time": own_time_words(sm),
        }
        body.append('<table class="facts"><tbody>')
        for k, v in facts.items():
            if v is not None:
                body.append(f"<tr><th>{escape(k)}</th><td>{escape(_fmt(v))}</td></tr>")
        body.append("</tbody></table>")
        for w in reader_notes(r):
            body.append(f'<p class="note">reader: {escape(w)}</p>')
        mine = [f for f in findings if f.run == r.name]
        body.append("<h3>Findings</h3>")
        if not mine:
            text = no_findings(r)
            body.append(f"<p>{escape(text[:1].upper() + text[1:])}.</p>")
        body += [_finding_html(f) for f in mine]
        body.append("<h3>Charts</h3>")
        body.append(_charts(r, i))
        ps = profile_summary(r)
        if ps is not None:
            first, *rest = profile_lines(ps)
            body.append('<section class="profile"><h3>Profile</h3>')
            body.append(f"<p>{escape(first)}</p><ul>")
            body += [f"<li>{escape(x)}</li>" for x in rest]
            body.append("</ul></section>")
        body.append(float8_html(r))
        body.append(memory_html(r))
        body.append("<h3>Layers</h3>")
        body.append(_layer_table(r, mine))
        body.append("</section>")
    names = {r.name for r in runs}
    rest = [f for f in findings if f.run not in names]
    if rest:
        body.append("<h2>Across runs</h2>")
        body += [_finding_html(f) for f in rest]
    body.append(f'<p class="note">mpwatch {escape(__version__)}</p>')
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>mpwatch diagnosis: {escape(where)}</title><style>{CSS}</style></head>"
        "<body><main>\n" + "\n".join(body) + "\n</main></body></html>\n"
    )
