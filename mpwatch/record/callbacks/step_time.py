"""StepTimeMonitor: median step time per logging interval and peak memory."""

from __future__ import annotations

import statistics
import time
from typing import Any

from mpwatch import contract
from mpwatch.record.callbacks.base import RecordingCallback, before_next_multiple
from mpwatch.record.runtime.backend import (  # noqa: F401  (old import path of these)
    gpu_device,
    peak_memory_mb,
    process_peak_rss_mb,
    reset_peak_memory,
)


class StepTimeMonitor(RecordingCallback):
    """Median time per batch over each logging interval and peak memory.

    ``mpwatch/perf/step_time_ms``: the median, over the Keras calls of the interval, of the wall
    time of one train-function call divided by the batches it ran (``steps_per_execution``), in
    ms per batch. The first call of each ``fit`` (tracing, warm-up) is left out. A call's time
    runs from its batch begin to the moment its results are ready: alone, this callback's batch
    end (Keras makes the step's logs Python numbers first, which waits for the device); inside
    :class:`MixedPrecisionMonitor`, which clocks the calls itself (:meth:`add_call`), also when
    Keras runs the batch ends on a thread and the device works ahead of the host: then from the
    later of the call's begin and the previous call's results, to its own results, and the
    interval's value is then their mean (:meth:`add_call`).
    ``mpwatch/perf/peak_memory_mb``: on a GPU the device's peak memory (the backend's allocator;
    TensorFlow's peak is reset when training begins, JAX's is the process's peak so far),
    otherwise the process's peak RSS.

    Args:
        log_dir: the run directory.
        log_every: interval in batch steps.

    Example:
        >>> model.fit(x, y, callbacks=[StepTimeMonitor(log_dir="logs/run1")])  # doctest: +SKIP
    """

    part = "step_time"

    def __init__(self, log_dir: Any, log_every: int = 50) -> None:
        super().__init__(log_dir, log_every)
        self._times: list[float] = []
        self._t0: float | None = None
        self._calls = 0
        self._device: str | None = None
        self.clocked = False  # set by MixedPrecisionMonitor: it times the calls (add_call)
        self._pool = [0.0, 0]  # pooled calls of the interval: seconds, batches

    def _begin(self) -> None:
        self._times, self._pool = [], [0.0, 0]
        self._calls = 0
        self._device = gpu_device()
        reset_peak_memory(self._device)

    def _batch_begin(self, batch: int) -> None:
        if not self.clocked:
            self._t0 = time.perf_counter()

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        if not self.clocked:
            t1 = time.perf_counter()
            self._calls += 1
            if self._t0 is not None and self._calls > 1:
                self._times.append((t1 - self._t0) / max(1, got.n))
            self._t0 = None
        if any(s % self.log_every == 0 for s in got.steps):
            self._write(got.last_step)

    def add_call(self, seconds: float, batches: int, pooled: bool = False) -> None:
        """One call's time, clocked by :class:`MixedPrecisionMonitor` (the fit's first call is
        not given). ``pooled``: clocked from Keras' worker thread, whose clock of a call's
        results can lag by its wait for the interpreter lock: that moves time between
        neighbouring calls, never out of the interval, so the interval's value is the pool's
        mean (its time over its batches) rather than the calls' median."""
        if pooled:
            self._pool[0] += seconds
            self._pool[1] += max(1, batches)
        else:
            self._times.append(seconds / max(1, batches))

    def quiet_through(self, step: int) -> int:
        """Clocked by the monitor, only the interval's end writes."""
        if not self.clocked:
            return step
        return before_next_multiple(step, self.log_every)

    def _write(self, step: int) -> None:
        values = {contract.PEAK_MEMORY_MB: peak_memory_mb(self._device)}
        if self._pool[1]:
            values[contract.STEP_TIME_MS] = 1000.0 * self._pool[0] / self._pool[1]
        elif self._times:
            values[contract.STEP_TIME_MS] = 1000.0 * statistics.median(self._times)
        self.writer.scalars(step, values)
        self._times, self._pool = [], [0.0, 0]

    def _end(self) -> None:
        if self._times or self._pool[1]:
            self._write(self.state.step)
