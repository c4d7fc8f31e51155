"""Trace + model → the ``profile`` record payload: its op part and, on a GPU, its kernel part.

:func:`summarize` is what the recorder writes (``record/callbacks/profile_capture.py``): the trace's
op table (:func:`mpwatch.profile.traces.trace_ops`) joined to the layers
(:func:`mpwatch.profile.ops.layer_time`) and, where the trace has GPU kernels, their figures
(:func:`mpwatch.profile.kernel_time.kernel_time`), trimmed to stay under the writer's size limit.
:func:`summarize_kernels` is the kernel part alone.

Example (needs TensorFlow and xprof):
    >>> from mpwatch import profile  # doctest: +SKIP
    >>> payload = profile.summarize("logs/run1", model)  # doctest: +SKIP
    >>> payload["source"], payload["share_16bit"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from mpwatch.profile.kernel_time import KernelProfile, kernel_time, trim_kernels
from mpwatch.profile.ops import layer_time
from mpwatch.profile.traces import (
    KERNEL_TOOL,
    OP_COLUMNS,
    ProfileError,
    find_traces,
    has_gpu_planes,
    kernel_table,
    trace_ops,
)


def summarize(
    trace: str | os.PathLike,
    model: Any,
    steps: Sequence[int] | None = None,
    dtype_overrides: Mapping[str, str] | None = None,
    ops: str = "framework",
    dims: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Trace (file, run directory or logdir) + model → the ``profile`` record payload.

    The op part (``layers``, ``op_types``, ``share_16bit``, ``cast_us``...: :func:`layer_time`)
    comes from :func:`trace_ops` (``ops``). When the trace has GPU kernels, the kernel part is
    added (:meth:`KernelProfile.record_fields`: ``kernel_summary``, ``kernel_layers``,
    ``kernels``; ``dims``: layer name or path -> its Tensor Core dimensions) and ``source`` is
    ``"device_kernels"``: precision and Tensor Core use per layer are then what the GPU ran.
    Otherwise ``source`` is ``"host_ops"`` (CPU: precision from the layer's dtype) or
    ``"device_ops"``. ``model`` None: no layer join for the op part (``share_16bit`` NaN: the ops'
    precision is unknown), the kernel part joins JAX scopes by name.
    """
    traces = find_traces(trace)
    trace_dir = os.path.dirname(traces[0])
    kernels: KernelProfile | None = None
    kernel_note = ""
    try:
        if has_gpu_planes(traces):  # else xprof's kernel tool only logs an error on stderr
            table = kernel_table(traces)
            if len(table):
                kernels = kernel_time(table, model, dims)
    except ProfileError as e:
        kernel_note = f"no GPU kernel figures: {e}"
    try:
        result = layer_time(trace_ops(traces, ops), model, dtype_overrides)
        payload = result.payload(steps=steps, trace_dir=trace_dir)
        hlo_bits = result.ops.attrs.get("source") == "xla_host"
        if hlo_bits:
            payload["tool"] = "xla_host_events"
            payload["bits_rule"] = (
                "XLA ops from the XLA CPU runtime's events: each op's precision from the HLO "
                "instruction it runs (dot/convolution by their operand types, other work by the "
                "float types it reads and writes: 16 where all are float16/bfloat16; converts "
                "are casts, 32), its owner from the instruction's op name (or those fused into "
                "it); other ops: " + payload["bits_rule"]
            )
    except ProfileError:
        if kernels is None:
            raise
        hlo_bits = False
        payload = _ops_part_from_kernels(kernels, steps, trace_dir)
    if model is None and not hlo_bits:
        payload["share_16bit"] = float("nan")
        payload["bits_rule"] += "; no model given: the ops' precision is unknown"
    if kernels is not None:
        payload["source"] = "device_kernels"
        payload.update(kernels.record_fields())
        trim_kernels(payload, kernels)
    else:
        payload["source"] = "device_ops" if payload.get("side") == "device" else "host_ops"
        if kernel_note:
            payload["kernel_note"] = kernel_note
    return payload


def _ops_part_from_kernels(
    kernels: KernelProfile, steps: Sequence[int] | None, trace_dir: str
) -> dict[str, Any]:
    """The op part of a record when the trace has GPU kernels but no framework op table."""
    s = kernels.summary
    empty = layer_time(pd.DataFrame(columns=OP_COLUMNS), None)
    payload = empty.payload(steps=steps, trace_dir=trace_dir)
    payload.update(
        device="GPU",
        total_us=float(s["total_us"]),
        unattributed_us=float(s["unattributed_us"]),
        unattributed_by_category={},
        cast_us=0.0,
        cast_share=float("nan"),
        share_16bit=float(s["share_16bit"]),
        side="device",
        tool=KERNEL_TOOL,
        bits_rule="no framework op table in the trace: figures from the GPU kernels",
    )
    return payload


def summarize_kernels(
    trace: str | os.PathLike,
    model: Any = None,
    steps: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Trace (file, run directory or logdir) [+ model] → the GPU kernel payload (see
    :meth:`KernelProfile.payload`)."""
    traces = find_traces(trace)
    result = kernel_time(kernel_table(traces), model)
    return result.payload(steps=steps, trace_dir=os.path.dirname(traces[0]))
