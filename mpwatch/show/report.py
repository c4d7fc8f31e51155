"""Render a diagnosis (runs + findings) as text, Markdown, JSON or a self-contained HTML page.

- ``text``: for a terminal; ANSI colours when ``color=True`` (the CLI turns them on for a tty,
  and honours ``NO_COLOR``).
- ``markdown``: for an issue or a pull request.
- ``json``: a stable, documented schema (:data:`JSON_SCHEMA`, a JSON Schema draft 2020-12 dict;
  ``"schema": "mpwatch.diagnosis/1"`` in every document). Non-finite numbers become ``null``.
  Fields are only ever added within version 1.
- ``html``: one file, no JavaScript, no external resources; inline SVG charts (loss scale with the
  skipped steps marked, underflow over time, the log2 gradient histogram with the float16 window),
  the per-layer table and the findings (see :mod:`mpwatch.show.html`).

Example:
    >>> from mpwatch import load_runs, diagnose  # doctest: +SKIP
    >>> from mpwatch.show.report import render  # doctest: +SKIP
    >>> runs = load_runs("logs")  # doctest: +SKIP
    >>> print(render(runs, diagnose(runs), "markdown"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mpwatch import contract
from mpwatch._version import __version__
from mpwatch.contract import json_safe
from mpwatch.judge import SEVERITIES, Finding
from mpwatch.read.run import Run

__all__ = [
    "FORMATS",
    "JSON_SCHEMA",
    "SCHEMA_ID",
    "render",
    "to_json",
    "run_summary",
    "profile_summary",
]

FORMATS = ("text", "markdown", "json", "html")
SCHEMA_ID = "mpwatch.diagnosis/1"
NO_DATA = (
    "no mpwatch data in {where}: no event file holds an mpwatch/ scalar or record. Record a run "
    "with mpwatch.MixedPrecisionMonitor(log_dir=...) in model.fit's callbacks."
)

_FINDING_SCHEMA = {
    "type": "object",
    "required": [
        "rule",
        "severity",
        "title",
        "evidence",
        "fix",
        "layer",
        "run",
        "why",
        "source",
        "action",
        "data",
    ],  # fmt: skip
    "properties": {
        "rule": {"type": "string", "description": "rule id (see mpwatch.judge.advisor.RULES)"},
        "severity": {"enum": list(SEVERITIES)},
        "title": {"type": "string"},
        "evidence": {"type": "string", "description": "the numbers that triggered it"},
        "fix": {"type": "string", "description": "what to change, as code"},
        "layer": {"type": ["string", "null"], "description": "null for run-level findings"},
        "run": {"type": ["string", "null"]},
        "why": {"type": "string"},
        "source": {"type": "string"},
        "action": {"type": "object", "description": "machine-readable advice"},
        "data": {"type": "object", "description": "the numbers, machine-readable"},
    },
}

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://mpwatch.dev/schemas/diagnosis-1.json",
    "title": "mpwatch diagnosis",
    "type": "object",
    "required": ["schema", "mpwatch_version", "logdir", "has_data", "runs", "findings", "counts"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "mpwatch_version": {"type": "string"},
        "logdir": {"type": ["string", "null"]},
        "has_data": {"type": "boolean", "description": "any run holds mpwatch data"},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "name",
                    "path",
                    "has_data",
                    "policy",
                    "steps",
                    "summary",
                    "warnings",
                ],  # fmt: skip
                "properties": {
                    "name": {"type": "string"},
                    "path": {"type": "string"},
                    "has_data": {"type": "boolean"},
                    "policy": {"type": ["string", "null"]},
                    "device": {"type": ["object", "null"]},
                    "steps": {
                        "type": "object",
                        "required": ["first", "last", "count"],
                        "properties": {
                            "first": {"type": ["integer", "null"]},
                            "last": {"type": ["integer", "null"]},
                            "count": {"type": "integer", "minimum": 0},
                        },
                    },
                    "summary": {
                        "type": "object",
                        "properties": {
                            "final_loss_scale": {"type": ["number", "null"]},
                            "skipped_steps": {"type": ["integer", "null"]},
                            "probes": {"type": "integer"},
                            "layers": {"type": "integer"},
                            "underflow_fraction": {"type": ["number", "null"]},
                            "recommended_scale": {"type": ["number", "null"]},
                            "step_time_ms": {"type": ["number", "null"]},
                            "peak_memory_mb": {"type": ["number", "null"]},
                        },
                    },
                    "profile": {
                        "type": ["object", "null"],
                        "description": "where the profiled time went; null when not profiled",
                        "required": ["steps", "total_ms", "share_16bit", "cast_share",
                                     "top_layers"],  # fmt: skip
                        "properties": {
                            "steps": {"type": "array", "items": {"type": ["integer", "null"]}},
                            "device": {"type": ["string", "null"]},
                            "total_ms": {"type": ["number", "null"]},
                            "share_16bit": {"type": ["number", "null"]},
                            "cast_share": {"type": ["number", "null"]},
                            "unattributed_share": {"type": ["number", "null"]},
                            "top_layers": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["layer", "time_ms"],
                                    "properties": {
                                        "layer": {"type": "string"},
                                        "time_ms": {"type": "number"},
                                        "share": {"type": ["number", "null"]},
                                        "share_16bit": {"type": ["number", "null"]},
                                    },
                                },
                            },
                        },
                    },
                    "warnings": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "findings": {"type": "array", "items": _FINDING_SCHEMA},
        "counts": {
            "type": "object",
            "required": list(SEVERITIES),
            "properties": {s: {"type": "integer", "minimum": 0} for s in SEVERITIES},
        },
    },
}


def _runs_list(runs: Run | Mapping[str, Run] | Sequence[Run]) -> list[Run]:
    if isinstance(runs, Run):
        return [runs]
    if isinstance(runs, Mapping):
        return list(runs.values())
    return list(runs)


def _last(run: Run, tag: str) -> float | None:
    s = run.scalar(tag)
    if not len(s):
        return None
    v = float(s.iloc[-1])
    return v if math.isfinite(v) else None


def run_summary(run: Run) -> dict[str, Any]:
    """The headline numbers of a run (the JSON ``runs[].summary``)."""
    skipped = run.scalar(contract.STEP_SKIPPED)
    if len(skipped):
        n_skipped: int | None = int((skipped > 0.5).sum())
    else:
        tot = _last(run, contract.SKIPPED_STEPS_TOTAL)
        n_skipped = int(round(tot)) if tot is not None else None
    pm = run.probe_model
    uf = rec = None
    if len(pm):
        last = pm.sort_values("step").iloc[-1]
        uf = _f(last.get("underflow_fraction"))
        rec = _f(last.get("recommended_scale"))
    st = run.scalar(contract.STEP_TIME_MS)
    mem = run.scalar(contract.PEAK_MEMORY_MB)
    return {
        "final_loss_scale": _last(run, contract.LOSS_SCALE),
        "skipped_steps": n_skipped,
        "probes": int(len(pm)),
        "layers": int(len(run.layers)),
        "underflow_fraction": uf,
        "recommended_scale": rec,
        "step_time_ms": float(st.median()) if len(st) else None,
        "peak_memory_mb": float(mem.max()) if len(mem) else None,
    }


def profile_summary(run: Run, top: int = 5) -> dict[str, Any] | None:
    """The profile section (the JSON ``runs[].profile``): where the profiled time went, from the
    latest ``profile`` record; None when the run was not profiled."""
    prof = run.profile
    if not prof:
        return None
    total = _f(prof.get("total_us"))
    layers: list[dict[str, Any]] = []
    tbl = prof.get("layers")
    if isinstance(tbl, Mapping) and "columns" in tbl:
        cols = list(tbl["columns"])
        rows = [dict(zip(cols, r)) for r in tbl.get("data") or []]
        rows.sort(key=lambda r: -(_f(r.get("time_us")) or 0.0))
        for r in rows[:top]:
            t = _f(r.get("time_us")) or 0.0
            t16 = _f(r.get("time_16bit_us")) or 0.0
            layers.append(
                {
                    "layer": str(r.get("layer")),
                    "time_ms": t / 1000.0,
                    "share": t / total if total else None,
                    "share_16bit": t16 / t if t else None,
                }
            )
    steps = prof.get("steps") or [None, None]
    return {
        "steps": [int(x) if isinstance(x, (int, float)) else None for x in list(steps)[:2]],
        "device": prof.get("device"),
        "total_ms": total / 1000.0 if total is not None else None,
        "share_16bit": _f(prof.get("share_16bit")),
        "cast_share": _f(prof.get("cast_share")),
        "unattributed_share": (
            (_f(prof.get("unattributed_us")) or 0.0) / total if total else None
        ),
        "top_layers": layers,
    }


def _profile_lines(ps: dict[str, Any]) -> list[str]:
    """The profile section as plain lines (text and markdown share them)."""
    first, last = (ps["steps"] + [None, None])[:2]
    head = f"profiled steps {first}-{last}" if first is not None else "profiled"
    bits = [head]
    if ps["total_ms"] is not None:
        bits.append(f"{ps['total_ms']:.3g} ms of op time")
    if ps["share_16bit"] is not None:
        bits.append(f"{ps['share_16bit']:.1%} in 16-bit")
    if ps["cast_share"] is not None:
        bits.append(f"{ps['cast_share']:.1%} in Cast ops")
    if ps["unattributed_share"] is not None:
        bits.append(f"{ps['unattributed_share']:.1%} outside layers")
    lines = [", ".join(bits)]
    for lay in ps["top_layers"]:
        share = "" if lay["share"] is None else f" ({lay['share']:.1%})"
        s16 = "" if lay["share_16bit"] is None else f", {lay['share_16bit']:.0%} 16-bit"
        lines.append(f"{lay['layer']}: {lay['time_ms']:.3g} ms{share}{s16}")
    return lines


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _steps(run: Run) -> dict[str, Any]:
    idx = run.scalars.index
    if not len(idx):
        return {"first": None, "last": None, "count": 0}
    return {"first": int(idx[0]), "last": int(idx[-1]), "count": int(len(idx))}


def to_json(
    runs: Run | Mapping[str, Run] | Sequence[Run],
    findings: Sequence[Finding],
    logdir: str | None = None,
) -> dict[str, Any]:
    """The diagnosis as a JSON-able dict following :data:`JSON_SCHEMA`."""
    rl = _runs_list(runs)
    doc = {
        "schema": SCHEMA_ID,
        "mpwatch_version": __version__,
        "logdir": logdir,
        "has_data": any(r.has_data for r in rl),
        "runs": [
            {
                "name": r.name,
                "path": r.path,
                "has_data": r.has_data,
                "policy": r.info.get("policy"),
                "device": r.info.get("device"),
                "steps": _steps(r),
                "summary": run_summary(r),
                "profile": profile_summary(r),
                "warnings": list(r.warnings),
            }
            for r in rl
        ],
        "findings": [f.to_dict() for f in findings],
        "counts": {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES},
    }
    return json_safe(doc)


# --- text ----------------------------------------------------------------------------------------
_COLOURS = {"error": "\x1b[1;31m", "warning": "\x1b[33m", "info": "\x1b[36m"}
_BOLD, _DIM, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


def _run_header(r: Run) -> str:
    st = _steps(r)
    sm = run_summary(r)
    bits = [str(r.info.get("policy") or "policy unknown")]
    if st["count"]:
        bits.append(f"steps {st['first']}-{st['last']}")
    if sm["final_loss_scale"] is not None:
        bits.append(f"final loss scale {sm['final_loss_scale']:g}")
    if sm["skipped_steps"] is not None:
        bits.append(f"{sm['skipped_steps']} skipped steps")
    if sm["probes"]:
        bits.append(f"{sm['probes']} probes")
    if sm["step_time_ms"] is not None:
        bits.append(f"{sm['step_time_ms']:.3g} ms/step")
    return ", ".join(bits)


def _counts_line(findings: Sequence[Finding]) -> str:
    c = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    return f"{c['error']} error(s), {c['warning']} warning(s), {c['info']} info"


def _text(rl: list[Run], findings: Sequence[Finding], logdir: str | None, color: bool) -> str:
    def paint(s: str, code: str) -> str:
        return f"{code}{s}{_RESET}" if color else s

    where = logdir or (rl[0].path if rl else "this logdir")
    lines = [paint(f"mpwatch diagnosis of {where}", _BOLD)]
    if not any(r.has_data for r in rl):
        lines.append(NO_DATA.format(where=where))
        for r in rl:
            for w in r.warnings:
                lines.append(f"  reader: {r.name}: {w}")
        return "\n".join(lines) + "\n"
    for r in rl:
        if not r.has_data:
            lines.append(f"\nrun {r.name!r}: no mpwatch data")
            continue
        lines.append("")
        lines.append(paint(f"run {r.name!r}", _BOLD) + f": {_run_header(r)}")
        for w in r.warnings:
            lines.append(paint(f"  reader: {w}", _DIM))
        ps = profile_summary(r)
        if ps is not None:
            first, *rest = _profile_lines(ps)
            lines.append(f"  profile: {first}")
            lines += [f"           {x}" for x in rest]
        mine = [f for f in findings if f.run == r.name]
        if not mine:
            lines.append("  no findings: mixed precision looks healthy")
        for f in mine:
            tag = paint(f"{f.severity.upper():7s}", _COLOURS[f.severity])
            lines.append(f"  {tag} {f.title}  [{f.rule}]")
            lines.append(f"          {f.evidence}")
            if f.fix:
                fix = f.fix.replace("\n", "\n               ")
                lines.append(f"          fix: {paint(fix, _DIM) if color else fix}")
    others = [f for f in findings if f.run not in {r.name for r in rl}]
    for f in others:
        tag = paint(f"{f.severity.upper():7s}", _COLOURS[f.severity])
        lines.append(f"  {tag} {f.title}  [{f.rule}]\n          {f.evidence}")
    lines.append("")
    lines.append(_counts_line(findings))
    return "\n".join(lines) + "\n"


# --- markdown ------------------------------------------------------------------------------------
def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _markdown(rl: list[Run], findings: Sequence[Finding], logdir: str | None) -> str:
    where = logdir or (rl[0].path if rl else "this logdir")
    out = [f"# mpwatch diagnosis of `{where}`", ""]
    if not any(r.has_data for r in rl):
        out.append(NO_DATA.format(where=f"`{where}`"))
        return "\n".join(out) + "\n"
    out += ["| run | policy | steps | final loss scale | skipped | probes | ms/step |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rl:
        st, sm = _steps(r), run_summary(r)
        fls = sm["final_loss_scale"]
        out.append(
            f"| {_md_escape(r.name)} | {_md_escape(r.info.get('policy') or '')} | "
            f"{st['first'] if st['count'] else ''}-{st['last'] if st['count'] else ''} | "
            f"{'' if fls is None else f'{fls:g}'} | "
            f"{'' if sm['skipped_steps'] is None else sm['skipped_steps']} | {sm['probes']} | "
            f"{'' if sm['step_time_ms'] is None else format(sm['step_time_ms'], '.3g')} |"
        )
    for r in rl:
        ps = profile_summary(r)
        if ps is not None:
            first, *rest = _profile_lines(ps)
            out += ["", f"**Profile of run `{_md_escape(r.name)}`:** {_md_escape(first)}", ""]
            out += [f"- {_md_escape(x)}" for x in rest]
    out += ["", f"**{_counts_line(findings)}**", ""]
    icons = {"error": "🔴", "warning": "🟠", "info": "🔵"}
    for f in findings:
        where_f = f"run `{f.run}`" + (f", layer `{f.layer}`" if f.layer else "")
        out.append(f"## {icons[f.severity]} {f.severity}: {_md_escape(f.title)}")
        out.append("")
        out.append(f"*{where_f} · rule `{f.rule}`*")
        out.append("")
        out.append(f"**Evidence:** {_md_escape(f.evidence)}")
        out.append("")
        if f.fix:
            out += ["**Fix:**", "", "```python", f.fix, "```", ""]
        if f.why:
            out.append(f"**Why:** {_md_escape(f.why)} *(source: {_md_escape(f.source)})*")
            out.append("")
    for r in rl:
        for w in r.warnings:
            out.append(f"> reader, run `{r.name}`: {_md_escape(w)}")
    return "\n".join(out).rstrip() + "\n"


# --- entry point ---------------------------------------------------------------------------------
def render(
    runs: Run | Mapping[str, Run] | Sequence[Run],
    findings: Sequence[Finding],
    fmt: str = "text",
    *,
    logdir: str | None = None,
    color: bool = False,
) -> str:
    """The diagnosis in one of :data:`FORMATS`."""
    rl = _runs_list(runs)
    if fmt == "text":
        return _text(rl, findings, logdir, color)
    if fmt == "markdown":
        return _markdown(rl, findings, logdir)
    if fmt == "json":
        return json.dumps(to_json(rl, findings, logdir), indent=2, allow_nan=False) + "\n"
    if fmt == "html":
        from mpwatch.show.html import render_html

        return render_html(rl, findings, logdir)
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _np_default(o: Any) -> Any:  # pragma: no cover - safety net for json.dumps
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o))
