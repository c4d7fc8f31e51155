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

The logs are read here with TensorBoard's raw record loader and the contract's decoding, not with
:mod:`mpwatch.read` (recording never depends on the read layer): only the three series this needs,
with the contract's "later writes win" (:func:`mpwatch.contract.later_writes_win`) applied as the
reader does.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from typing import Any

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
    try:
        logs = _read_logs(log_dir)
    except (OSError, ValueError) as e:  # unreadable logs: steps start at iterations
        logger.warning("mpwatch: could not read %s to find the resumed step: %s", log_dir, e)
        return None
    anchors = [
        (int(step), info["start"])
        for step, info in logs.run_infos
        if isinstance(info.get("start"), dict) and isinstance(info["start"].get("iterations"), int)
    ]
    if not anchors:
        return None
    steps, scales = logs.series(contract.LOSS_SCALE)
    flag_steps, flags = logs.series(contract.STEP_SKIPPED)
    skipped = np.zeros(len(steps), dtype=bool)
    pos = np.searchsorted(steps, flag_steps)
    inside = pos < len(steps)
    inside[inside] &= steps[pos[inside]] == flag_steps[inside]
    skipped[pos[inside]] = flags[inside] > 0

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


@dataclass
class _Logs:
    """What resume needs of a run directory: two scalar series and the run_info records."""

    scalars: dict[str, tuple[list[int], list[float]]]
    run_infos: list[tuple[int, dict[str, Any]]]

    def series(self, tag: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one tag after "later writes win", sorted by step."""
        steps, values = self.scalars.get(tag, ([], []))
        st = np.asarray(steps, dtype=np.int64)
        va = np.asarray(values, dtype=np.float64)
        keep = contract.later_writes_win(np.arange(len(st)), st)
        st, va = st[keep], va[keep]
        order = np.argsort(st, kind="stable")
        return st[order], va[order]


_SCALAR_TAGS = (contract.LOSS_SCALE, contract.STEP_SKIPPED)


def _read_logs(log_dir: str) -> _Logs:
    """Scan the run directory's event files (TensorBoard's raw loader, which stops quietly at a
    cut last record) for the loss scale, the skip flags and the run_info records."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    info_tag = contract.record_tag(contract.KIND_RUN_INFO)
    scalars: dict[str, tuple[list[int], list[float]]] = {t: ([], []) for t in _SCALAR_TAGS}
    infos: list[tuple[int, dict[str, Any]]] = []
    for path in contract.event_files(log_dir):
        for raw in RawEventFileLoader(path).Load():
            event = event_pb2.Event.FromString(raw)
            for value in event.summary.value:
                if value.tag in scalars:
                    scalars[value.tag][0].append(int(event.step))
                    scalars[value.tag][1].append(_scalar_of(value.tensor))
                elif value.tag == info_tag and value.tensor.string_val:
                    payload = contract.decode_payload(value.tensor.string_val[0])
                    infos.append((int(event.step), payload))
    steps = np.asarray([s for s, _ in infos], dtype=np.int64)
    kept = contract.later_writes_win(np.arange(len(steps)), steps, strict=True).tolist()
    return _Logs(scalars=scalars, run_infos=[infos[i] for i in kept])


def _scalar_of(tensor: Any) -> float:
    """The float32 scalar of a ``tf.summary.scalar`` tensor proto."""
    if tensor.tensor_content:
        return float(np.frombuffer(tensor.tensor_content, dtype="<f4")[0])
    if tensor.float_val:
        return float(tensor.float_val[0])
    return float(tensor.double_val[0]) if tensor.double_val else float("nan")
