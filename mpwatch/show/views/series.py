"""The step series of a run as the reports and the tab draw them: the loss scale from the first
step, where the optimizer skipped updates, a scalar's last value.

Computed once here from what a run holds; the HTML report draws them as SVG
(:mod:`mpwatch.show.html`), the tab serves them as JSON (``tensorboard_plugin_mpwatch``).

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> run = next(iter(mpwatch.load_run("logs/run1").values()))  # doctest: +SKIP
    >>> skip_marks(run)  # doctest: +SKIP
    ([37, 38], [])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch.read import Run

__all__ = ["initial_scale", "last_value", "loss_scale_series", "scale_from_the_first_step",
           "skip_marks"]  # fmt: skip


def last_value(run: Run, tag: str) -> float | None:
    """The scalar's value at its last recorded step, when finite."""
    s = run.scalar(tag)
    return contract.finite_float(s.iloc[-1]) if len(s) else None


def initial_scale(infos: Sequence[tuple[int, Any]]) -> tuple[int, float] | None:
    """(step, scale) the run's first step used, from its first ``run_info`` record (``infos``:
    ``(step, payload)`` pairs; written at the step before the first batch and never sampled away,
    unlike a scalar point): the optimizer's scale then, or its ``initial_scale`` when it was not
    built yet. None for a resumed or continued run (``iterations`` past 0) and without a dynamic
    loss scale."""
    if not infos:
        return None
    step, info = min(infos, key=lambda item: item[0])
    ls = info.get("loss_scale") if isinstance(info, dict) else None
    start = info.get("start") if isinstance(info, dict) else None
    if not isinstance(ls, dict) or ls.get("kind") != "dynamic" or not isinstance(start, dict):
        return None
    if start.get("iterations") != 0:
        return None
    scale = start.get("loss_scale")
    scale = ls.get("initial") if scale is None else scale
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        return None
    return int(step), float(scale)


def scale_from_the_first_step(
    infos: Sequence[tuple[int, Any]], steps: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``mpwatch/loss_scale`` is the scale after each step, and the recorder writes the scale
    before the first step at step 0. Where that point is missing (TensorBoard's reservoir sampled
    it away, or a run recorded before it was written), the run's first ``run_info`` gives it
    (:func:`initial_scale`)."""
    first = initial_scale(infos)
    if first is None or not len(steps) or int(steps[0]) <= first[0]:
        return steps, values
    return (
        np.concatenate([[first[0]], steps]).astype(np.int64),
        np.concatenate([[first[1]], values]).astype(np.float64),
    )


def loss_scale_series(run: Run) -> pd.Series:
    """The loss scale by step from the first step (:func:`scale_from_the_first_step`)."""
    ls = run.scalar(contract.LOSS_SCALE)
    infos = run.records.get(contract.KIND_RUN_INFO) or []
    steps, values = scale_from_the_first_step(
        infos, ls.index.to_numpy(dtype=np.int64), ls.to_numpy(dtype=np.float64)
    )
    if len(steps) == len(ls):
        return ls
    return pd.Series(values, index=pd.Index(steps, name=ls.index.name))


def skip_marks(run: Run) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Where the optimizer skipped updates: ``(steps, spans)``.

    ``steps``: exactly the skipped steps, from the per-step flag ``mpwatch/step_skipped``. A run
    without the flag has only the cumulative ``mpwatch/skipped_steps_total``, which says how many
    steps between two of its points were skipped, not which: ``spans`` of ``(first, last,
    count)`` (the steps from the previous recorded point, or the run's first, to this one), and
    no step."""
    if len(run.scalar(contract.STEP_SKIPPED)):
        return [int(s) for s in run.skipped_steps().index], []
    total = run.scalar(contract.SKIPPED_STEPS_TOTAL)
    total = total[np.isfinite(total)]
    if not len(total):
        return [], []
    steps = total.index.to_numpy(dtype=np.int64)
    rise = np.round(np.diff(total.to_numpy(), prepend=0.0)).astype(np.int64)
    recorded = run.scalars.index.to_numpy(dtype=np.int64)
    before = recorded[(recorded >= 1) & (recorded < steps[0])]
    first_step = int(before.min()) if len(before) else 1  # batch steps start at 1
    starts = np.concatenate([[first_step], steps[:-1] + 1])
    return [], [(int(a), int(b), int(k)) for a, b, k in zip(starts, steps, rise) if k > 0]
