"""The tab's scalars route (:func:`scalars_view`): every mpwatch scalar series downsampled to the
chart's points, how many steps each was recorded at, and the skipped steps to mark.

TensorBoard serves a sample of each scalar tag (``--samples_per_plugin scalars=N``, 1,000 by
default, the last point always). A series' ``count`` is the number of steps the tag was recorded
at: exact when TensorBoard served the whole series (``count_exact``), else counted on the
series' cadence between its first and last served steps (:func:`recorded_steps`).

>>> [s.tolist() for s in downsample(np.arange(4), np.array([1.0, 5.0, 2.0, 0.0]), 10)]
[[0, 1, 2, 3], [1.0, 5.0, 2.0, 0.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpwatch import contract, words
from mpwatch.read import Run
from mpwatch.show.views import scale_from_the_first_step, skip_marks
from tensorboard_plugin_mpwatch.data.provider import RunRecords

__all__ = ["downsample", "recorded_steps", "scalars_view", "skipped_view"]


def _floats(arr: np.ndarray) -> list[float | None]:
    """A float array as a JSON list (non-finite -> None), fast for long series."""
    arr = np.asarray(arr, dtype=np.float64)
    out: list[Any] = arr.tolist()
    if not np.isfinite(arr).all():
        for i in np.flatnonzero(~np.isfinite(arr)).tolist():
            out[i] = None
    return out


def downsample(steps: np.ndarray, values: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``points`` points: per bucket of equal step count keep the first, min and max points
    (so spikes and drops survive) and always the last point."""
    n = len(steps)
    if n <= points:
        return steps, values
    buckets = max(1, points // 3)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = [edges[:-1]]
    finite = np.where(np.isfinite(values), values, np.nan)
    starts = edges[:-1]
    valid = edges[1:] > starts
    starts = starts[valid]
    with np.errstate(all="ignore"):
        filled_hi = np.where(np.isnan(finite), -np.inf, finite)
        filled_lo = np.where(np.isnan(finite), np.inf, finite)
    # argmax/argmin per bucket via reduceat on values, then locate the index
    hi = np.maximum.reduceat(filled_hi, starts)
    lo = np.minimum.reduceat(filled_lo, starts)
    bucket_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    is_hi = filled_hi == hi[bucket_of]
    is_lo = filled_lo == lo[bucket_of]
    first_hi = np.flatnonzero(is_hi)
    first_lo = np.flatnonzero(is_lo)
    keep.append(first_hi[np.unique(bucket_of[first_hi], return_index=True)[1]])
    keep.append(first_lo[np.unique(bucket_of[first_lo], return_index=True)[1]])
    nonfinite = np.flatnonzero(~np.isfinite(values))[:points]
    keep.append(nonfinite)
    keep.append(np.array([n - 1]))
    idx = np.unique(np.concatenate(keep))
    return steps[idx], values[idx]


def recorded_steps(steps: np.ndarray, sampled: bool) -> tuple[int, bool]:
    """How many steps a scalar tag was recorded at, and whether that count is exact.

    The whole series served: its length, exact. A sample: the steps on the series' cadence (the
    greatest common divisor of the gaps between served steps: 1 for a per-step tag, ``log_every``
    for an interval tag) from the first served step to the last (always served): exact for
    mpwatch's regular tags when TensorBoard kept the first point.

    >>> recorded_steps(np.array([3, 7, 10]), sampled=False)
    (3, True)
    >>> recorded_steps(np.array([10, 40, 50, 90]), sampled=True)  # every 10 steps, 10 to 90
    (9, False)
    """
    n = len(steps)
    if not sampled or n < 2:
        return n, not sampled
    gaps = np.diff(steps)
    gaps = gaps[gaps > 0]
    cadence = int(np.gcd.reduce(gaps)) if len(gaps) else 1
    return int((int(steps[-1]) - int(steps[0])) // max(cadence, 1) + 1), False


SKIPPED_LIMIT = 10_000


def _skipped_spans(model: Run) -> list[list[int]]:
    """Without the per-step flag ``mpwatch/step_skipped`` (a run recorded without it), only the
    cumulative ``mpwatch/skipped_steps_total`` says where skips happened: ``[first, last, count]``
    per rise (:func:`mpwatch.show.views.skip_marks`). Which steps of the span were skipped is
    unknown, so the tab shades the span and marks no single step."""
    return [list(span) for span in skip_marks(model)[1][:SKIPPED_LIMIT]]


def skipped_view(model: Run, records: RunRecords) -> dict[str, Any]:
    """The skipped-step markers and total, from :meth:`Run.skipped_steps`.

    ``skipped_steps`` are exactly the steps whose update the optimizer dropped, from the per-step
    flag ``mpwatch/step_skipped`` (never a step whose update was applied, never the step of an
    interval counter). A run without the flag has only the cumulative count: its skips are
    ``skipped_spans`` (``[first, last, count]``, see :func:`_skipped_spans`) and no step is
    marked. When TensorBoard served only a sample of ``mpwatch/step_skipped``, some skipped steps
    are not in it: the total then comes from the cumulative ``mpwatch/skipped_steps_total`` (its
    last point is always served), and ``skipped_marked_all`` is false.
    """
    spans = _skipped_spans(model)
    per_step = model.skipped_steps()
    if spans:  # the counter's rises, not steps: nothing to mark at a step
        total = int(per_step.sum())
        return {
            "skipped_steps": [],
            "skipped_spans": spans,
            "skipped_total": total,
            "skipped_marked_all": False,
        }
    steps = per_step.index.to_numpy(dtype=np.int64)
    total = int(per_step.sum())
    flag = contract.STEP_SKIPPED
    complete = not (flag in model.scalars.columns and records.sampled.get(flag, False))
    if not complete:
        cumulative = model.scalar(contract.SKIPPED_STEPS_TOTAL)
        cumulative = cumulative[np.isfinite(cumulative)]
        if len(cumulative):
            total = max(total, int(round(float(cumulative.iloc[-1]))))
        complete = total == int(per_step.sum())
    return {
        "skipped_steps": steps[:SKIPPED_LIMIT].tolist(),
        "skipped_spans": [],
        "skipped_total": total,
        "skipped_marked_all": bool(complete and len(steps) <= SKIPPED_LIMIT),
    }


def scalars_view(records: RunRecords, model: Run, points: int) -> dict[str, Any]:
    """Every mpwatch scalar series, downsampled to at most ``points`` points, and the skipped steps.

    Per series: ``steps`` and ``values`` (the points drawn), ``count`` (how many steps the tag was
    recorded at, see :func:`recorded_steps`), ``count_exact`` (false when TensorBoard served only a
    sample and ``count`` is counted on the series' cadence), ``served`` (how many points
    TensorBoard served: its sample). The loss scale starts at the run's first step
    (:func:`mpwatch.show.views.scale_from_the_first_step`).
    """
    series = {}
    for tag, (steps, values) in sorted(records.scalars.items()):
        count, exact = recorded_steps(steps, records.sampled.get(tag, False))
        if tag == contract.LOSS_SCALE:
            infos = records.records.get(contract.KIND_RUN_INFO) or []
            steps, values = scale_from_the_first_step(infos, steps, values)
        s, v = downsample(steps, values, points)
        series[tag] = {
            "steps": s.tolist(),
            "values": _floats(v),
            "count": count,
            "count_exact": exact,
            "served": int(records.served.get(tag, len(steps))),
        }
    scale = series.get(contract.LOSS_SCALE)
    scale_text = None
    if scale and scale["values"]:
        scale_text = {
            "first": words.loss_scale(scale["values"][0]),
            "last": words.loss_scale(scale["values"][-1]),
        }
    return {
        "run": model.name,
        "series": series,
        "loss_scale_text": scale_text,
        **skipped_view(model, records),
    }
