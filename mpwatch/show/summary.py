"""The numbers every report shows, read from a :class:`mpwatch.read.Run` through its accessors.

Shared by :mod:`mpwatch.show.report` (text, Markdown, JSON) and :mod:`mpwatch.show.html`; neither
imports the other's internals, and this module imports neither.

- :func:`run_summary`: the headline numbers (the JSON ``runs[].summary``);
- :func:`profile_summary` and :func:`profile_lines`: where the profiled time went;
- :func:`step_range`: the first and last step and how many steps hold a scalar;
- :data:`NO_DATA`: what every format says about a logdir without mpwatch data, and
  :func:`no_data_words` where data were there but could not be read (:data:`NO_READABLE_DATA`);
- :func:`unreadable` (the ``damaged-logs`` errors) and :func:`reader_notes` (what the reader
  skipped that no finding says).

Example:
    >>> from mpwatch.read import Run
    >>> run_summary(Run(name=".", path=""))["skipped_steps"] is None
    True
    >>> finite_float("nan") is None, finite_float(2)
    (True, 2.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpwatch import contract
from mpwatch.judge import Finding
from mpwatch.judge.rules.damaged_logs import RULE as DAMAGED_LOGS
from mpwatch.read import Run
from mpwatch.show.views import UNJOINED_SAID, last_value, source_label, unjoined_math_share
from mpwatch.words import NO_FINDINGS, NO_FINDINGS_TRACE_ONLY, duration_ms, percent, raw_trace

__all__ = [
    "NO_DATA",
    "NO_READABLE_DATA",
    "no_data_words",
    "reader_notes",
    "unreadable",
    "finite_float",
    "last_value",
    "loss_scales_words",
    "no_findings",
    "profile_lines",
    "profile_summary",
    "run_summary",
    "runs_list",
    "step_range",
    "trace_only",
]

NO_DATA = (
    "no mpwatch data in {where}: no event file holds an mpwatch/ scalar or record. Record a run "
    "with mpwatch.MixedPrecisionMonitor(log_dir=...) in model.fit's callbacks."
)


NO_READABLE_DATA = (
    "no mpwatch data could be read in {where}: part of it could not be read (the errors below "
    "say what, and where); what was read holds no mpwatch/ scalar or record."
)


def unreadable(findings: Sequence[Finding]) -> list[Finding]:
    """The findings saying that written data could not be read (``damaged-logs`` errors)."""
    return [f for f in findings if f.rule == DAMAGED_LOGS.id and f.severity == "error"]


def no_data_words(findings: Sequence[Finding], where: str) -> str:
    """What a report says when no run holds mpwatch data: :data:`NO_READABLE_DATA` when part of
    the logdir could not be read (data may be there), :data:`NO_DATA` otherwise."""
    return (NO_READABLE_DATA if unreadable(findings) else NO_DATA).format(where=where)


def reader_notes(run: Run) -> list[str]:
    """The reader's warnings no finding says (its problems are ``damaged-logs`` findings)."""
    said = {q.message for q in run.problems}
    return [w for w in run.warnings if w not in said]


finite_float = contract.finite_float  # the one definition, in the contract


def runs_list(runs: Run | Mapping[str, Run] | Sequence[Run]) -> list[Run]:
    """One Run, a name -> Run mapping (``load_runs``) or a sequence of Runs, as a list."""
    if isinstance(runs, Run):
        return [runs]
    if isinstance(runs, Mapping):
        return list(runs.values())
    return list(runs)


def step_range(run: Run) -> dict[str, Any]:
    """``{"first", "last", "count"}`` over the steps that hold any scalar (the JSON ``steps``)."""
    idx = run.scalars.index
    if not len(idx):
        return {"first": None, "last": None, "count": 0}
    return {"first": int(idx[0]), "last": int(idx[-1]), "count": int(len(idx))}


def _skipped_total(run: Run) -> int | None:
    """Skipped updates in the run (``Run.skipped_steps().sum()``), None when nothing about skips
    was recorded (a run without a loss scale, or recorded without the loss-scale callback)."""
    if not (
        len(run.scalar(contract.STEP_SKIPPED)) or len(run.scalar(contract.SKIPPED_STEPS_TOTAL))
    ):
        return None
    return int(run.skipped_steps().sum())


def probe_not_measured(model: dict[str, Any]) -> str | None:
    """Why a probe's underflow and recommended scale mean nothing, or None when they do: its
    gradients were not finite (an overflow), or the loss scale was 0."""
    reasons = []
    nonfinite = model.get("nonfinite")
    first = model.get("first_nonfinite_layer")
    if (isinstance(nonfinite, (int, float)) and nonfinite > 0) or (
        isinstance(first, str) and first
    ):
        details = []
        if isinstance(nonfinite, (int, float)) and nonfinite > 0:
            size = model.get("size")
            of = f" of {int(size)}" if isinstance(size, (int, float)) and size > 0 else ""
            details.append(f"{int(nonfinite)}{of} elements inf or NaN")
        if first == "loss":
            details.append("first in the loss")
        elif isinstance(first, str) and first:
            details.append(f"first at layer {first}")
        said = f" ({', '.join(details)})" if details else ""
        reasons.append(f"the gradients were not finite at this probe{said}")
    scale = model.get("loss_scale")
    if model.get("mode") != "bfloat16" and isinstance(scale, (int, float)) and scale == 0:
        reasons.append("the loss scale had fallen to 0")
    return "; ".join(reasons) if reasons else None


def loss_scales_words(scales: Mapping[str, float | None], words: Any) -> str:
    """``"d_optimizer 2^11 (2048), g_optimizer no loss scale"``: ``words`` says a scale."""
    return ", ".join(
        f"{name} {words(s) if s is not None else 'no loss scale'}" for name, s in scales.items()
    )


def run_summary(run: Run) -> dict[str, Any]:
    """The headline numbers of a run (the JSON ``runs[].summary``). ``final_loss_scale`` is the
    recorded one's; where the compiled optimizer never stepped, ``loss_scales`` holds the final
    scale of each optimizer that did (:meth:`Run.stepping_loss_scales`) and ``final_loss_scale``
    is None."""
    probe = run.latest_probe()
    model = probe.model if probe is not None else {}
    if model and probe_not_measured(model):  # its underflow and safe scale mean nothing
        model = {}
    st = run.scalar(contract.STEP_TIME_MS)
    mem = run.scalar(contract.PEAK_MEMORY_MB)
    scales = run.stepping_loss_scales()
    return {
        "final_loss_scale": None if scales else last_value(run, contract.LOSS_SCALE),
        "loss_scales": scales,
        "skipped_steps": _skipped_total(run),
        "probes": int(len(run.probe_model)),
        "layers": int(len(run.layers)),
        "underflow_fraction": finite_float(model.get("underflow_fraction")),
        "recommended_scale": finite_float(model.get("recommended_scale")),
        "step_time_ms": float(st.median()) if len(st) else None,
        "peak_memory_mb": float(mem.max()) if len(mem) else None,
        **own_cost(run),
    }


#: what "mpwatch's own time" leaves out, said beside it: the tap's ops run inside the train step
#: (their trace and compile are in Keras' first step, their cost in every step's time)
OWN_TIME_LEAVES_OUT = "; its tap inside the train step not counted"


def own_time_words(sm: dict[str, Any]) -> str | None:
    """A run summary's (:func:`run_summary`) mpwatch time in words, with what it leaves out;
    None for a run recorded without a budget."""
    if sm["mpwatch_seconds"] is None:
        return None
    return (
        f"{duration_ms(1000 * sm['mpwatch_seconds'])} "
        f"({percent(sm['mpwatch_share'])} of the fit{OWN_TIME_LEAVES_OUT})"
    )


def own_cost(run: Run) -> dict[str, float | None]:
    """mpwatch's own time over all the fits of the run with a ``budget`` record, and its share of
    their wall time (``None`` for runs recorded without one)."""
    own = [b.get("own_seconds") for b in run.budgets]
    fit = [b.get("fit_seconds") for b in run.budgets]
    if not own or not all(isinstance(v, (int, float)) for v in own + fit) or sum(fit) <= 0:
        return {"mpwatch_seconds": None, "mpwatch_share": None}
    return {"mpwatch_seconds": float(sum(own)), "mpwatch_share": float(sum(own) / sum(fit))}


#: what a profile's figures are, by ``source`` (the reports' label)
def profile_summary(run: Run, top: int = 5) -> dict[str, Any] | None:
    """The profile section (the JSON ``runs[].profile``): where the profiled time went, from the
    latest ``profile`` record; None when the run was not profiled.

    ``source`` says what the figures are (``contract.PROFILE_SOURCES``). On a GPU trace
    (``device_kernels``) the time, the 16-bit share and the layers are the kernels' device time,
    with ``tensor_core_share`` (mpwatch's reading of the kernel names) beside
    ``xprof_tensor_core_share`` (xprof's "Kernel uses TensorCore"), ``unknown_share`` and
    ``by_precision_share``; each top layer adds its Tensor Core share and forward/backward time.
    Elsewhere the op time, each op counted in its layer's dtype."""
    prof = run.profile
    if not prof:
        return None
    source = run.profile_source
    kern = run.profile_kernels if source == "device_kernels" else None
    total = finite_float((kern or prof).get("total_us"))
    layers: list[dict[str, Any]] = []
    table = run.profile_kernel_layers if kern is not None else run.profile_layers
    rows = table.to_dict("records")
    rows.sort(key=lambda r: -(finite_float(r.get("time_us")) or 0.0))
    for r in rows[:top]:
        t = finite_float(r.get("time_us")) or 0.0
        if kern is not None:
            t16 = (finite_float(r.get("float16_us")) or 0.0) + (
                finite_float(r.get("bfloat16_us")) or 0.0
            )
        else:
            t16 = finite_float(r.get("time_16bit_us")) or 0.0
        row: dict[str, Any] = {
            "layer": str(r.get("layer")),
            "time_ms": t / 1000.0,
            "share": t / total if total else None,
            "share_16bit": t16 / t if t else None,
        }
        if kern is not None:
            row.update(
                tensor_core_share=finite_float(r.get("tensor_core_share")),
                forward_ms=(finite_float(r.get("forward_us")) or 0.0) / 1000.0,
                backward_ms=(finite_float(r.get("backward_us")) or 0.0) / 1000.0,
            )
        layers.append(row)
    steps = prof.get("steps") or [None, None]
    out: dict[str, Any] = {
        "steps": [int(x) if isinstance(x, (int, float)) else None for x in list(steps)[:2]],
        "device": prof.get("device"),
        "source": source,
        "total_ms": total / 1000.0 if total is not None else None,
        "share_16bit": finite_float((kern or prof).get("share_16bit")),
        "cast_share": finite_float(prof.get("cast_share")),
        "unattributed_share": (
            (finite_float((kern or prof).get("unattributed_us")) or 0.0) / total if total else None
        ),
        "unjoined_math_share": None if kern is not None else unjoined_math_share(prof),
        "source_label": source_label(prof, source),
        "top_layers": layers,
        "trace": run.profile_trace,
    }
    if kern is not None:
        by = kern.get("by_precision_share")
        out.update(
            tensor_core_share=finite_float(kern.get("tensor_core_share")),
            xprof_tensor_core_share=finite_float(kern.get("xprof_tensor_core_share")),
            unknown_share=finite_float(kern.get("unknown_share")),
            by_precision_share={
                str(k): finite_float(v)
                for k, v in (by.items() if isinstance(by, Mapping) else [])
                if finite_float(v)
            },
        )
    return out


def trace_only(run: Run) -> bool:
    """Whether the run is only a profiler trace, read as it is (no mpwatch record, no run facts)."""
    return not run.info and bool(run.profile_trace)


def no_findings(run: Run) -> str:
    """What the report says of a run without findings: healthy, or, for a run that is only a
    profiler trace, that the profile showed nothing (the rest was not recorded, so not judged)."""
    return NO_FINDINGS_TRACE_ONLY if trace_only(run) else NO_FINDINGS


def profile_lines(ps: dict[str, Any]) -> list[str]:
    """A :func:`profile_summary` as plain lines (text, Markdown and HTML share them)."""
    first, last = (ps["steps"] + [None, None])[:2]
    head = f"profiled steps {first}-{last}" if first is not None else "profiled"
    bits = [head]
    gpu = ps.get("source") == "device_kernels"
    if ps["total_ms"] is not None:
        bits.append(f"{duration_ms(ps['total_ms'])} of {'GPU kernel' if gpu else 'op'} time")
    if ps["share_16bit"] is not None:
        bits.append(f"{percent(ps['share_16bit'])} in 16-bit{' kernels' if gpu else ''}")
    if gpu and ps.get("unknown_share") is not None:
        bits.append(f"{percent(ps['unknown_share'])} of unknown precision (never counted 16-bit)")
    if ps["cast_share"] is not None and not gpu:
        bits.append(f"{percent(ps['cast_share'])} in Cast ops")
    if ps["unattributed_share"] is not None:
        outside = f"{percent(ps['unattributed_share'])} outside layers"
        if (ps.get("unjoined_math_share") or 0.0) >= UNJOINED_SAID:
            outside += (
                f" ({percent(ps['unjoined_math_share'])} of the time in matmul/conv ops joined to"
                " no layer: their precision not read, counted 32-bit)"
            )
        bits.append(outside)
    lines = [", ".join(bits)]
    if ps.get("trace"):
        lines.append(raw_trace(ps["trace"]))
    if gpu:
        tc, xtc = ps.get("tensor_core_share"), ps.get("xprof_tensor_core_share")
        if tc is not None:
            line = f"Tensor Cores: {percent(tc)} of GPU time by their HLO and names (mpwatch)"
            if xtc is not None:
                line += f", {percent(xtc)} by xprof's 'Kernel uses TensorCore' flag"
            lines.append(line)
        by = ps.get("by_precision_share") or {}
        if by:
            lines.append(
                "by precision: " + ", ".join(f"{k} {percent(v)}" for k, v in by.items() if v)
            )
    elif ps.get("source"):
        lines.append(f"figures: {ps.get('source_label') or ps['source']}")
    for lay in ps["top_layers"]:
        share = "" if lay["share"] is None else f" ({percent(lay['share'])})"
        s16 = "" if lay["share_16bit"] is None else f", {percent(lay['share_16bit'])} 16-bit"
        extra = ""
        if lay.get("tensor_core_share") is not None:
            extra = (
                f", {percent(lay['tensor_core_share'])} on Tensor Cores, forward "
                f"{duration_ms(lay['forward_ms'])} / backward {duration_ms(lay['backward_ms'])}"
            )
        lines.append(f"{lay['layer']}: {duration_ms(lay['time_ms'])}{share}{s16}{extra}")
    return lines
