"""The tab's views of one Run as JSON: the layer table (:func:`layers_view`), the probes
(:func:`probes_view`: probe steps, one probe, the layer x step underflow heatmap), the profile
(:func:`profile_view`) and the run's facts (:func:`info_view`). Every number comes from the Run and
its accessors (``latest_probe``, ``profile_kernel_layers``, ...), as the CLI reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from mpwatch import contract, words
from mpwatch.contract import json_safe
from mpwatch.read import ProbeResult, Run
from mpwatch.read.run import PROBE_TOP_KEYS
from mpwatch.show.views import (
    UNJOINED_SAID,
    float8_view,
    memory_view,
    source_label,
    underflow_heatmap,
    unjoined_math_share,
)
from mpwatch.words import plain

__all__ = ["info_view", "layers_view", "probes_view", "profile_summary", "profile_view"]


def _rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A Run table as row dicts, missing values (NaN) as None."""
    if not len(df):
        return []
    return df.astype(object).where(pd.notna(df), None).to_dict("records")


def _split(df: pd.DataFrame, drop: tuple[str, ...] = ("step",)) -> dict[str, Any] | None:
    """A Run table back in the record layout (``{"columns", "data"}``), None when empty."""
    if not len(df.columns):
        return None
    df = df.drop(columns=[c for c in drop if c in df.columns])
    rows = df.astype(object).where(pd.notna(df), None).values.tolist()
    return contract.table([str(c) for c in df.columns], rows)


LAYER_COLUMNS = (
    "name",
    "class",
    "compute_dtype",
    "variable_dtype",
    "output_dtype",
    "effective_dtype",
    "params",
    "underflow_fraction",
    "grad_rel_error",
    "output_rel_error",
    "max_abs_activation",
    "time_share",
    "tensor_core_share",
    "tc_aligned",
    "is_output",
    "note",
)


def layers_view(model: Run, found: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-layer table: dtypes from the Run's layer table, numerics from its latest probe
    (:meth:`Run.latest_probe`), time share from its profile, findings per layer.

    The time share is the GPU kernels' device time on a GPU trace (``time_source``
    ``device_kernels``, with each layer's ``tensor_core_share``), else the profiled ops' time
    (``host_ops``/``device_ops``). Layers the profile or the probe saw that the layer table lacks
    (a trace summarized without a model) get rows of their own."""
    layers = _rows(model.layers) if "name" in model.layers.columns else []
    probe = model.latest_probe()
    by_layer_probe: dict[Any, dict[str, Any]] = {}
    if probe is not None and "layer" in probe.layers.columns:
        by_layer_probe = {row.get("layer"): row for row in _rows(probe.layers)}
    profile = model.profile or {}
    source = model.profile_source
    timed = model.profile_kernel_layers if source == "device_kernels" else model.profile_layers
    by_layer_time = {row.get("layer"): row for row in _rows(timed)}
    badges: dict[str, list[dict[str, str]]] = {}
    for f in found:
        if f.get("layer"):
            badges.setdefault(str(f["layer"]), []).append(
                {"severity": f["severity"], "rule": f["rule"], "title": f["title"]}
            )
    rows = []
    names = {row.get("name") for row in layers}
    for name in [*by_layer_probe, *by_layer_time]:  # seen by the probe or the profile only
        if name not in names and name is not None:
            layers.append({"name": name, "class": by_layer_time.get(name, {}).get("class")})
            names.add(name)
    for row in layers:
        name = row.get("name")
        p = by_layer_probe.get(name, {})
        t = by_layer_time.get(name, {})
        rows.append(
            [
                name,
                row.get("class"),
                row.get("compute_dtype"),
                row.get("variable_dtype"),
                row.get("output_dtype"),
                row.get("effective_dtype"),
                row.get("params"),
                p.get("underflow_fraction"),
                p.get("grad_rel_error"),
                p.get("output_rel_error"),
                p.get("max_abs_activation"),
                t.get("share"),
                t.get("tensor_core_share"),
                row.get("tc_aligned"),
                row.get("is_output"),
                row.get("note"),
            ]
        )
    return json_safe(
        {
            "run": model.name,
            "columns": list(LAYER_COLUMNS),
            "rows": rows,
            "badges": badges,
            "probe_step": probe.step if probe is not None else None,
            "profiled": bool(profile),
            "time_source": source,
        }
    )


# the probe_model columns that are not the record's "model" dict
_PROBE_TOP_KEYS = ("step", *PROBE_TOP_KEYS)


def _probe_at(model: Run, step: int) -> ProbeResult | None:
    """The probe at ``step``: :meth:`Run.latest_probe` of the Run seen up to that probe, also when
    it is marked unreliable (the panel says so)."""
    pm = model.probe_model
    at = dataclasses.replace(model, probe_model=pm[pm["step"] == step])
    return at.latest_probe(reliable_only=False)


def _probe_json(probe: ProbeResult) -> dict[str, Any]:
    row = probe.model
    return {
        "step": probe.step,
        "mode": row.get("mode"),
        "loss_scale": row.get("loss_scale"),
        "reference": row.get("reference"),
        "reference_note": row.get("reference_note"),
        "reliable": row.get("reliable"),
        "unreliable_reason": row.get("unreliable_reason"),
        "model": {k: v for k, v in row.items() if k not in _PROBE_TOP_KEYS},
        "histogram": probe.histogram,
        "sweep": _split(probe.sweep),
        "recommended_scale": row.get("recommended_scale"),
        "text": _probe_text(row),
    }


def _probe_text(row: dict[str, Any]) -> dict[str, str]:
    """The probe's facts as the tab writes them (:mod:`mpwatch.words`, the CLI's and the HTML
    report's spelling): its scale and the largest safe one as ``2^k (v)``, underflow and gradient
    error as percents, the largest activation as a plain number."""
    return {
        "loss_scale": words.loss_scale(row.get("loss_scale")),
        "recommended_scale": words.loss_scale(row.get("recommended_scale")),
        "underflow": words.percent(row.get("underflow_fraction")),
        "grad_error": words.percent(row.get("grad_rel_error")),
        "max_abs_activation": words.number(row.get("max_abs_activation")),
    }


def probes_view(model: Run, step: int | None) -> dict[str, Any]:
    """Probe steps and the probe at ``step`` (KeyError when there is none); without ``step``: the
    latest reliable probe (:meth:`Run.latest_probe`) and the layer × probe-step underflow heatmap.
    ``unreliable_steps``: the probes whose loss disagreed with the train step's."""
    pm = model.probe_model
    steps = sorted({int(s) for s in pm["step"]}) if len(pm) else []
    unreliable = model.unreliable_probe_steps()
    if step is None:
        probe = model.latest_probe()
        heatmap = underflow_heatmap(model)
    else:  # a step picks a histogram: no heatmap
        if step not in steps:
            raise KeyError(step)
        probe, heatmap = _probe_at(model, step), None
    return json_safe(
        {
            "run": model.name,
            "steps": steps,
            "unreliable_steps": unreliable,
            "heatmap": heatmap,
            "probe": _probe_json(probe) if probe is not None else None,
        }
    )


def profile_summary(model: Run) -> dict[str, Any] | None:
    """The tab's profile panel: the figures to show side by side, None without a profile.

    ``source`` and its ``label``; the time (``total_us``), ``share_16bit`` and
    ``unattributed_share``; on a GPU trace also ``tensor_core_share`` (mpwatch, by the kernel
    names) beside ``xprof_tensor_core_share`` (xprof's "Kernel uses TensorCore"),
    ``tensor_core_missed_by_xprof_share`` (why they differ), ``unknown_share`` and
    ``by_precision_share``; elsewhere ``cast_share`` and ``unjoined_math_share`` (matmul/conv ops
    joined to no layer), with ``unjoined_said`` the share from which the tab says it."""
    prof = model.profile
    if not prof:
        return None
    source = model.profile_source
    kern = model.profile_kernels if source == "device_kernels" else None
    base = kern if kern is not None else prof
    total = contract.finite_float(base.get("total_us"))
    out: dict[str, Any] = {
        "source": source,
        "label": source_label(prof, source),
        "steps": prof.get("steps"),
        "device": prof.get("device"),
        "total_us": total,
        "share_16bit": contract.finite_float(base.get("share_16bit")),
        "unattributed_share": (
            (contract.finite_float(base.get("unattributed_us")) or 0.0) / total if total else None
        ),
        # the capture a profile without a record was read from, and the words for it
        "trace": model.profile_trace,
        "trace_text": words.raw_trace(model.profile_trace) if model.profile_trace else None,
    }
    if kern is None:
        out["cast_share"] = contract.finite_float(prof.get("cast_share"))
        out["unjoined_math_share"] = unjoined_math_share(prof)
        out["unjoined_said"] = UNJOINED_SAID
        return _with_text(out)
    by = kern.get("by_precision_share") if isinstance(kern.get("by_precision_share"), dict) else {}
    out.update(
        tensor_core_share=contract.finite_float(kern.get("tensor_core_share")),
        xprof_tensor_core_share=contract.finite_float(kern.get("xprof_tensor_core_share")),
        tensor_core_missed_by_xprof_share=contract.finite_float(
            kern.get("tensor_core_missed_by_xprof_share")
        ),
        unknown_share=contract.finite_float(kern.get("unknown_share")),
        by_precision_share={
            str(k): contract.finite_float(v) for k, v in by.items() if contract.finite_float(v)
        },
        kernels=kern.get("kernels"),
    )
    return _with_text(out)


def _with_text(summary: dict[str, Any]) -> dict[str, Any]:
    """The panel's figures as the tab writes them (:mod:`mpwatch.words`): ``text`` holds the time
    with its unit and every ``*_share`` as a percent."""
    text = {
        k: words.percent(v)
        for k, v in summary.items()
        if k.endswith("_share") and (v is None or isinstance(v, float))
    }
    text["total"] = words.duration_us(summary.get("total_us"))
    return {**summary, "text": text}


def profile_view(model: Run) -> dict[str, Any]:
    """The latest profile record (``profile``), its step, and the panel's figures
    (``summary``: :func:`profile_summary`)."""
    items = model.records.get(contract.KIND_PROFILE) or []
    return json_safe(
        {
            "run": model.name,
            "step": items[-1][0] if items else None,
            "profile": model.profile,
            "summary": profile_summary(model),
        }
    )


def info_view(model: Run) -> dict[str, Any]:
    """The run's facts, its notices (messages as plain text: Keras wraps exception messages in
    terminal escapes) and the errors met reading it (but what a ``damaged-logs`` finding says,
    as the reports leave it out: ``mpwatch.show.summary.reader_notes``)."""
    said = {q.message for q in model.problems}
    return {
        "info": model.info or None,
        "notices": [{**n, "message": plain(n.get("message") or "")} for n in model.notices],
        "errors": [w for w in model.warnings if w not in said],
        "memory": memory_view(model),
        "float8": float8_view(model),
    }
