"""LossScaleMonitor: the dynamic loss scale before the first step and after every step, and the
exact number of skipped steps."""

from __future__ import annotations

import math
from typing import Any

from mpwatch import contract
from mpwatch.record.callbacks.base import RecordingCallback
from mpwatch.record.runtime.run_info import no_loss_scale_reason
from mpwatch.record.tap.tap_common import loss_scale_optimizer


class LossScaleMonitor(RecordingCallback):
    """Records ``LossScaleOptimizer.dynamic_scale`` after every step and every skipped step.

    Writes ``mpwatch/loss_scale`` and ``mpwatch/step_skipped`` at every batch step (exact also with
    ``steps_per_execution > 1``: the values are collected in the graph, one slot per batch), and
    ``mpwatch/skipped_steps`` (in the interval) and ``mpwatch/skipped_steps_total`` (cumulative,
    across fit calls) every ``log_every`` steps and at the end of training. A skipped step is one
    whose update the optimizer dropped for non-finite gradients (``optimizer.iterations`` did not
    advance).

    ``mpwatch/loss_scale`` at step ``s`` is the scale after step ``s``, the one step ``s + 1``
    uses. So that the scale of the first step is recorded too, a run's first fit (one that starts
    at step 0, with ``optimizer.iterations`` 0) also writes ``mpwatch/loss_scale`` at step 0: the
    scale in effect before its first batch (the optimizer's initial scale). Later fits, and a
    resumed training state, continue from a step already recorded and write no step-0 point.

    Under ``mixed_bfloat16`` and ``float32`` there is no loss scale: a ``notice`` record says so
    once and nothing else is written.

    Args:
        log_dir: the run directory (created if needed).
        log_every: interval of the skipped-step counts, in batch steps.

    Example:
        >>> import keras, mpwatch  # doctest: +SKIP
        >>> monitor = mpwatch.LossScaleMonitor(log_dir="logs/run1")  # doctest: +SKIP
        >>> model.fit(x, y, callbacks=[monitor])  # doctest: +SKIP
    """

    part = "loss_scale"
    reads_tap = True

    def __init__(self, log_dir: Any, log_every: int = 50) -> None:
        super().__init__(log_dir, log_every)
        self._interval = 0
        self._interval_steps = 0
        self._has_scale = False
        self._steps: list[int] = []
        self._scales: list[float] = []
        self._skips: list[float] = []

    def _begin(self) -> None:
        self._has_scale = loss_scale_optimizer(self.model.optimizer) is not None
        self._steps, self._scales, self._skips = [], [], []
        self._interval = 0
        self._interval_steps = 0
        if not hasattr(self.state, "skipped_total"):
            self.state.skipped_total = 0
        if self._has_scale:
            self._write_initial_scale()
        else:
            told = getattr(self.state, "notices", set())
            if self.part not in told:
                self._notice(
                    self.part, "info", "no loss scale: " + no_loss_scale_reason(self.model)
                )
                told.add(self.part)
                self.state.notices = told

    def _write_initial_scale(self) -> None:
        """At the first batch of a run's first fit (step 0, ``iterations`` 0): the scale its first
        step uses, at step 0. ``state.start`` holds the optimizer's scale read just before that
        batch (after any restore); an optimizer not built yet starts at its ``initial_scale``."""
        start = getattr(self.state, "start", None) or {}
        if self.state.step != 0 or start.get("iterations") != 0:
            return  # a later fit or a resumed state: its starting scale is already recorded
        scale = start.get("loss_scale")
        if scale is None:
            opt = loss_scale_optimizer(self.model.optimizer)
            scale = getattr(opt, "initial_scale", None)
        if scale is None or not math.isfinite(float(scale)):
            return
        self.writer.scalar_series(contract.LOSS_SCALE, [0], [float(scale)])

    def _tap_data(self, got: Any) -> None:
        if not self._has_scale or got.loss_scale is None:
            return
        for s, v, k in zip(got.steps, got.loss_scale, got.skipped):
            if math.isnan(float(v)):
                continue
            self._steps.append(s)
            self._scales.append(float(v))
            self._skips.append(float(k))
            self._interval += int(k)
            self._interval_steps += 1
            self.state.skipped_total += int(k)
            if s % self.log_every == 0:
                self._write_interval(s)

    def _flush_series(self) -> None:
        # per-step values are buffered and written once per interval (cheap hot path)
        self.writer.scalar_series(contract.LOSS_SCALE, self._steps, self._scales)
        self.writer.scalar_series(contract.STEP_SKIPPED, self._steps, self._skips)
        self._steps, self._scales, self._skips = [], [], []

    def _write_interval(self, step: int) -> None:
        self._flush_series()
        self.writer.scalars(
            step,
            {
                contract.SKIPPED_STEPS: float(self._interval),
                contract.SKIPPED_STEPS_TOTAL: float(self.state.skipped_total),
            },
        )
        self._interval = 0
        self._interval_steps = 0

    def _end(self) -> None:
        if self._has_scale and self._interval_steps:
            self._write_interval(self._steps[-1] if self._steps else self.state.step)
