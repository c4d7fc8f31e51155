"""Where a resumed run's steps continue: the batch step of a restored training state, found in the
run's own logs.

mpwatch's step counts every batch, skipped ones too; ``optimizer.iterations`` does not count
skipped batches. A process that restores a checkpoint (Keras' ``BackupAndRestore``, a
``tf.train.Checkpoint``, ``model.load_weights``) has the restored ``iterations`` and
``dynamic_scale`` but not mpwatch's counter, so starting at ``iterations`` would write the resumed
steps over earlier, different batches (shifted by the number of skipped steps before the
checkpoint).

The logs know the mapping. Each ``run_info`` record (one per ``fit``) says, at the step before the
fit's first batch, the optimizer's ``iterations`` and loss scale then (``start``); the per-step
``mpwatch/step_skipped`` series says which later steps did not advance ``iterations``. So after
step ``s`` of a segment that began at anchor ``(a, I_a)``::

    iterations(s) = I_a + (s - a) - (skipped steps in (a, s])

and ``mpwatch/loss_scale`` gives the scale after ``s``. The restored state is the latest step whose
``(iterations, loss scale)`` equal the restored optimizer's (the pair is unique within a life:
``iterations`` grows on every applied step, and a run of skipped steps halves the scale each time).
The cumulative skipped-step count continues from the skips up to that step.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass

import numpy as np

from mpwatch import contract

logger = logging.getLogger("mpwatch")


@dataclass(frozen=True)
class ResumePoint:
    """The step a restored training state was at, and the skipped steps counted up to it."""

    step: int
    skipped_total: int


def find_resume_point(
    log_dir: str, iterations: int, loss_scale: float | None
) -> ResumePoint | None:
    """The batch step whose state the optimizer holds (``iterations`` and ``loss_scale`` after
    it), from the run's logs; None when the logs have no mpwatch anchor or no such step."""
    if iterations <= 0 or not glob.glob(os.path.join(log_dir, "*tfevents*")):
        return None
    from mpwatch.read.run import load_run

    try:
        run = load_run(log_dir, run=".", warn=False)
    except (OSError, ValueError) as e:  # unreadable logs: steps start at iterations
        logger.warning("mpwatch: could not read %s to find the resumed step: %s", log_dir, e)
        return None
    anchors = [
        (int(step), info["start"])
        for step, info in run.records.get(contract.KIND_RUN_INFO, [])
        if isinstance(info.get("start"), dict)
        and isinstance(info["start"].get("iterations"), int)
    ]
    if not anchors:
        return None
    scale = run.scalar(contract.LOSS_SCALE)
    steps = scale.index.to_numpy(dtype=np.int64)
    scales = scale.to_numpy(dtype=np.float64)
    skipped = run.scalar(contract.STEP_SKIPPED).reindex(scale.index).fillna(0.0).to_numpy() > 0

    cand_step: list[np.ndarray] = []
    cand_it: list[np.ndarray] = []
    cand_scale: list[np.ndarray] = []
    bounds = [a for a, _ in anchors[1:]] + [np.iinfo(np.int64).max]
    for (a, start), b in zip(anchors, bounds):
        it_a = int(start["iterations"])
        sc_a = start.get("loss_scale")
        cand_step.append(np.array([a]))
        cand_it.append(np.array([it_a]))
        cand_scale.append(np.array([np.nan if sc_a is None else float(sc_a)]))
        seg = (steps > a) & (steps <= b)
        s = steps[seg]
        cand_step.append(s)
        cand_it.append(it_a + (s - a) - np.cumsum(skipped[seg]))
        cand_scale.append(scales[seg])
    all_step = np.concatenate(cand_step)
    all_it = np.concatenate(cand_it)
    all_scale = np.concatenate(cand_scale)
    match = all_it == iterations
    if loss_scale is not None:
        match &= all_scale == float(loss_scale)
    if not match.any():
        return None
    step = int(all_step[match].max())
    return ResumePoint(step=step, skipped_total=int(skipped[steps <= step].sum()))
