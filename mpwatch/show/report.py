"""Render a diagnosis (runs + findings) as text, Markdown, JSON or a self-contained HTML page.

- ``text``: for a terminal; ANSI colours when ``color=True`` (the CLI turns them on for a tty,
  and honours ``NO_COLOR``). An info finding takes two lines (its evidence cut at
  :data:`INFO_EVIDENCE_CHARS`), and its fix only when the fix is code (not "nothing to do").
- ``markdown``: for an issue or a pull request; info findings with nothing to change are one line
  each under "Notes", at the end.
- ``json``: a stable, documented schema (:data:`JSON_SCHEMA`, a JSON Schema draft 2020-12 dict;
  ``"schema": "mpwatch.diagnosis/1"`` in every document). Non-finite numbers become ``null``.
  Fields are only ever added within version 1.
- ``html``: one file, no JavaScript, no external resources; inline SVG charts (loss scale with the
  skipped steps marked, underflow over time, the log2 gradient histogram with the float16 window),
  the per-layer table and the findings (see :mod:`mpwatch.show.html`).

The numbers come from :mod:`mpwatch.show.summary` (shared with the HTML page), which reads them from
the :class:`mpwatch.read.Run` and its accessors. Imports go one way: ``report`` -> ``html`` ->
``summary`` and ``charts_svg``; ``html`` never imports ``report``.

Example:
    >>> from mpwatch import load_runs, diagnose  # doctest: +SKIP
    >>> from mpwatch.show.report import render  # doctest: +SKIP
    >>> runs = load_runs("logs")  # doctest: +SKIP
    >>> print(render(runs, diagnose(runs), "markdown"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mpwatch._version import __version__
from mpwatch.contract import json_safe
from mpwatch.judge import SEVERITIES, Finding
from mpwatch.read import Run
from mpwatch.show.html import render_html
from mpwatch.show.summary import (
    NO_DATA,
    loss_scales_words,
    no_data_words,
    no_findings,
    own_time_words,
    profile_lines,
    profile_summary,
    reader_notes,
    run_summary,
    runs_list,
    step_range,
    trace_only,
    unreadable,
)
from mpwatch.show.views import memory_view
from mpwatch.words import TRACE_ONLY, duration_ms, loss_scale, plain

__all__ = [
    "FORMATS",
    "JSON_SCHEMA",
    "NO_DATA",
    "SCHEMA_ID",
    "render",
    "to_json",
    "run_summary",
    "profile_summary",
]

FORMATS = ("text", "markdown", "json", "html")
SCHEMA_ID = "mpwatch.diagnosis/1"

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
        "rule": {"type": "string", "description": "rule id (see mpwatch.judge.RULES)"},
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
                            "loss_scales": {
                                "type": ["object", "null"],
                                "additionalProperties": {"type": ["number", "null"]},
                            },
                            "skipped_steps": {"type": ["integer", "null"]},
                            "probes": {"type": "integer"},
                            "layers": {"type": "integer"},
                            "underflow_fraction": {"type": ["number", "null"]},
                            "recommended_scale": {"type": ["number", "null"]},
                            "step_time_ms": {"type": ["number", "null"]},
                            "peak_memory_mb": {"type": ["number", "null"]},
                            "mpwatch_seconds": {
                                "type": ["number", "null"],
                                "description": "mpwatch's own time in the run's fits (budget "
                                "records): its hooks' host time, not its tap's ops inside the "
                                "train step (their trace and compile are in Keras' first step, "
                                "their cost in every step's time); null when recorded without "
                                "one",
                            },
                            "mpwatch_share": {
                                "type": ["number", "null"],
                                "description": "mpwatch_seconds / the fits' wall time",
                            },
                        },
                    },
                    "memory": {
                        "type": ["object", "null"],
                        "description": "training memory by kind and dtype, and what float32, "
                        "mixed_float16 and mixed_bfloat16 would need (show/views/memory.py); null "
                        "without a memory record",
                        "required": ["policy", "by_dtype", "by_policy", "lines"],
                        "properties": {
                            "mpwatch_own": {
                                "type": ["object", "null"],
                                "description": "what mpwatch itself adds: probe_need_bytes "
                                "(the largest need a probe recorded beyond the training's "
                                "state), probe_need_from (XLA's memory analysis or an "
                                "estimate), probes; null where no probe recorded one",
                            },
                        },
                    },
                    "profile": {
                        "type": ["object", "null"],
                        "description": "where the profiled time went; null when not profiled",
                        "required": [
                            "steps",
                            "total_ms",
                            "share_16bit",
                            "cast_share",
                            "top_layers",
                        ],
                        "properties": {
                            "steps": {"type": "array", "items": {"type": ["integer", "null"]}},
                            "device": {"type": ["string", "null"]},
                            "trace": {
                                "type": ["string", "null"],
                                "description": "the capture directory of the raw profiler "
                                "trace the profile was read from (no profile record in the "
                                "run); null when the profile is a record",
                            },
                            "source": {
                                "type": ["string", "null"],
                                "description": "device_kernels (a GPU trace: the kernels' "
                                "device time, precision and Tensor Cores from their names), "
                                "host_ops or device_ops (ops counted in their layer's dtype)",
                            },
                            "source_label": {
                                "type": ["string", "null"],
                                "description": "what the figures are, in words (the tab's "
                                "caption too)",
                            },
                            "tensor_core_share": {
                                "type": ["number", "null"],
                                "description": "device_kernels: share of GPU time on Tensor "
                                "Cores by the kernels' HLO and names (mpwatch)",
                            },
                            "xprof_tensor_core_share": {
                                "type": ["number", "null"],
                                "description": "device_kernels: share xprof's 'Kernel uses "
                                "TensorCore' marks",
                            },
                            "unknown_share": {
                                "type": ["number", "null"],
                                "description": "device_kernels: share of unknown precision",
                            },
                            "by_precision_share": {
                                "type": "object",
                                "additionalProperties": {"type": ["number", "null"]},
                            },
                            "total_ms": {"type": ["number", "null"]},
                            "share_16bit": {"type": ["number", "null"]},
                            "cast_share": {"type": ["number", "null"]},
                            "unattributed_share": {"type": ["number", "null"]},
                            "unjoined_math_share": {
                                "type": ["number", "null"],
                                "description": "host ops: share in matmul/conv ops joined to "
                                "no layer (precision not read, counted 32-bit)",
                            },
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
                                        "tensor_core_share": {"type": ["number", "null"]},
                                        "forward_ms": {"type": "number"},
                                        "backward_ms": {"type": "number"},
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


def to_json(
    runs: Run | Mapping[str, Run] | Sequence[Run],
    findings: Sequence[Finding],
    logdir: str | None = None,
) -> dict[str, Any]:
    """The diagnosis as a JSON-able dict following :data:`JSON_SCHEMA`."""
    rl = runs_list(runs)
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
                "steps": step_range(r),
                "summary": run_summary(r),
                "profile": profile_summary(r),
                "memory": memory_view(r),
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
_OURS = re.compile(
    "(" + "|".join(re.escape(c) for c in {*_COLOURS.values(), _BOLD, _DIM, _RESET}) + ")"
)


def _terminal(text: str, color: bool) -> str:
    """The text report as it reaches a terminal: no escape sequence or control character (but
    newlines) other than the report's own colours, and none of those without ``color``. Notices
    carry Keras' escapes, and layer and run names are user input: none recolours the terminal or
    moves its cursor, and ``--no-color`` output holds no escape at all."""
    if not color:
        return plain(text)
    return "".join(p if i % 2 else plain(p) for i, p in enumerate(_OURS.split(text)))


def _run_header(r: Run) -> str:
    st = step_range(r)
    sm = run_summary(r)
    if trace_only(r):
        bits = [TRACE_ONLY]
    else:
        bits = [str(r.info.get("policy") or "policy unknown")]
    if st["count"]:
        bits.append(f"steps {st['first']}-{st['last']}")
    if sm["final_loss_scale"] is not None:
        bits.append(f"final loss scale {loss_scale(sm['final_loss_scale'])}")
    if sm["loss_scales"]:
        bits.append(f"final loss scales {loss_scales_words(sm['loss_scales'], loss_scale)}")
    if sm["skipped_steps"] is not None:
        bits.append(f"{sm['skipped_steps']} skipped steps")
    if sm["probes"]:
        bits.append(f"{sm['probes']} probes")
    if sm["step_time_ms"] is not None:
        bits.append(f"{duration_ms(sm['step_time_ms'])}/step")
    if (own := own_time_words(sm)) is not None:
        bits.append(f"mpwatch's own time {own}")
    return ", ".join(bits)


#: characters of an info finding's evidence in the text and Markdown reports (JSON and HTML: all)
INFO_EVIDENCE_CHARS = 200


def _short(text: str, n: int = INFO_EVIDENCE_CHARS) -> str:
    """One line of at most ``n`` characters."""
    one = " ".join(str(text).split())
    return one if len(one) <= n else one[: n - 1].rstrip() + "\u2026"


def _actionable(fix: str) -> bool:
    """Whether a fix holds code (not only ``# ...`` comments, such as "nothing to do")."""
    return any(ln.strip() and not ln.strip().startswith("#") for ln in str(fix).splitlines())


def _counts_line(findings: Sequence[Finding]) -> str:
    c = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    return f"{c['error']} error(s), {c['warning']} warning(s), {c['info']} info"


def _text(rl: list[Run], findings: Sequence[Finding], logdir: str | None, color: bool) -> str:
    def paint(s: str, code: str) -> str:
        return f"{code}{s}{_RESET}" if color else s

    def said(f: Finding) -> list[str]:
        tag = paint(f"{f.severity.upper():7s}", _COLOURS[f.severity])
        out = [f"  {tag} {f.title}  [{f.rule}]"]
        if f.severity == "info":
            # info: the title and one short line; no comment-only fix ("nothing to do")
            out.append(f"          {_short(f.evidence)}")
            if not _actionable(f.fix):
                return out
        else:
            out.append(f"          {f.evidence}")
        if f.fix:
            fix = f.fix.replace("\n", "\n               ")
            out.append(f"          fix: {paint(fix, _DIM) if color else fix}")
        return out

    where = logdir or (rl[0].path if rl else "this logdir")
    lines = [paint(f"mpwatch diagnosis of {where}", _BOLD)]
    if not any(r.has_data for r in rl):
        lines.append(no_data_words(findings, where))
        if not findings:
            for r in rl:
                for w in reader_notes(r):
                    lines.append(f"  reader: {r.name}: {w}")
            return "\n".join(lines) + "\n"
    for r in rl:
        mine = [f for f in findings if f.run == r.name]
        if not r.has_data:
            could = " could be read" if unreadable(mine) else ""
            lines.append(f"\nrun {r.name!r}: no mpwatch data{could}")
            if mine:
                lines += [paint(f"  reader: {w}", _DIM) for w in reader_notes(r)]
                lines += [x for f in mine for x in said(f)]
            continue
        lines.append("")
        lines.append(paint(f"run {r.name!r}", _BOLD) + f": {_run_header(r)}")
        for w in reader_notes(r):
            lines.append(paint(f"  reader: {w}", _DIM))
        ps = profile_summary(r)
        if ps is not None:
            first, *rest = profile_lines(ps)
            lines.append(f"  profile: {first}")
            lines += [f"           {x}" for x in rest]
        mv = memory_view(r)
        if mv is not None and mv["lines"]:
            first, *rest = mv["lines"]
            lines.append(f"  memory: {first}")
            lines += [f"          {x}" for x in rest]
        if not mine:
            lines.append(f"  {no_findings(r)}")
        lines += [x for f in mine for x in said(f)]
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


def _md_row(r: Run) -> str:
    st, sm = step_range(r), run_summary(r)
    fls = sm["final_loss_scale"]
    scales = loss_scales_words(sm["loss_scales"], loss_scale) if sm["loss_scales"] else ""
    policy = r.info.get("policy") or ("profiler trace only" if trace_only(r) else "")
    return (
        f"| {_md_escape(r.name)} | {_md_escape(policy)} | "
        f"{st['first'] if st['count'] else ''}-{st['last'] if st['count'] else ''} | "
        f"{_md_escape(scales) if fls is None else loss_scale(fls)} | "
        f"{'' if sm['skipped_steps'] is None else sm['skipped_steps']} | {sm['probes']} | "
        f"{'' if sm['step_time_ms'] is None else duration_ms(sm['step_time_ms'])} |"
    )


def _markdown(rl: list[Run], findings: Sequence[Finding], logdir: str | None) -> str:
    where = logdir or (rl[0].path if rl else "this logdir")
    out = [f"# mpwatch diagnosis of `{where}`", ""]
    if not any(r.has_data for r in rl):
        out.append(no_data_words(findings, f"`{where}`"))
        if not findings:  # else: the findings say what could not be read
            return "\n".join(out) + "\n"
    else:
        out += ["| run | policy | steps | final loss scale | skipped | probes | step time |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        out += [_md_row(r) for r in rl]
    for r in rl:
        ps = profile_summary(r)
        if ps is not None:
            first, *rest = profile_lines(ps)
            out += ["", f"**Profile of run `{_md_escape(r.name)}`:** {_md_escape(first)}", ""]
            out += [f"- {_md_escape(x)}" for x in rest]
        mv = memory_view(r)
        if mv is not None and mv["lines"]:
            first, *rest = mv["lines"]
            out += ["", f"**Memory of run `{_md_escape(r.name)}`:** {_md_escape(first)}", ""]
            out += [f"- {_md_escape(x)}" for x in rest]
    out += ["", f"**{_counts_line(findings)}**", ""]
    icons = {"error": "🔴", "warning": "🟠", "info": "🔵"}
    notes = [f for f in findings if f.severity == "info" and not _actionable(f.fix)]
    for f in findings:
        if any(f is n for n in notes):
            continue
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
    if notes:
        # info with nothing to change: one line each, at the end
        out += ["## 🔵 Notes (nothing to change)", ""]
        for f in notes:
            out.append(
                f"- {_md_escape(f.title)} (run `{f.run}`, rule `{f.rule}`): "
                f"{_md_escape(_short(f.evidence))}"
            )
        out.append("")
    for r in rl:
        for w in reader_notes(r):
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
    rl = runs_list(runs)
    if fmt == "text":
        return _terminal(_text(rl, findings, logdir, color), color)
    if fmt == "markdown":
        return _markdown(rl, findings, logdir)
    if fmt == "json":
        return json.dumps(to_json(rl, findings, logdir), indent=2, allow_nan=False) + "\n"
    if fmt == "html":
        return render_html(rl, findings, logdir)
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
