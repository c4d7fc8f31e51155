"""StepTimeMonitor: median step time per logging interval and peak memory."""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from typing import Any

from mpwatch import contract
from mpwatch.record.base import RecordingCallback


def gpu_device() -> str | None:
    """The first visible GPU's name ("GPU:0"), None without one."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name.replace("/device:", "") if gpus else None


def process_peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (``/proc`` VmHWM, else ``getrusage``)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def peak_memory_mb(device: str | None) -> float:
    """Device peak memory on a GPU (TensorFlow's allocator), process peak RSS otherwise."""
    if device is not None:
        import tensorflow as tf

        return tf.config.experimental.get_memory_info(device)["peak"] / (1024.0 * 1024.0)
    return process_peak_rss_mb()


class StepTimeMonitor(RecordingCallback):
    """Median time per batch over each logging interval and peak memory.

    ``mpwatch/perf/step_time_ms``: the median, over the Keras calls of the interval, of the wall
    time
    of one train-function call divided by the batches it ran (``steps_per_execution``), in ms per
    batch. The first call of each ``fit`` (tracing, warm-up) is left out.
    ``mpwatch/perf/peak_memory_mb``: on a GPU the device's peak memory (TensorFlow's allocator; the
    peak is reset when training begins), otherwise the process's peak RSS.

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

    def _begin(self) -> None:
        self._times = []
        self._calls = 0
        self._device = gpu_device()
        if self._device is not None:
            import tensorflow as tf

            try:
                tf.config.experimental.reset_memory_stats(self._device)
            except (ValueError, RuntimeError):
                pass

    def _batch_begin(self, batch: int) -> None:
        self._t0 = time.perf_counter()

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        t1 = time.perf_counter()
        self._calls += 1
        if self._t0 is not None and self._calls > 1:
            self._times.append((t1 - self._t0) / max(1, got.n))
        self._t0 = None
        if any(s % self.log_every == 0 for s in got.steps):
            self._write(got.last_step)

    def _write(self, step: int) -> None:
        values = {contract.PEAK_MEMORY_MB: peak_memory_mb(self._device)}
        if self._times:
            values[contract.STEP_TIME_MS] = 1000.0 * statistics.median(self._times)
        self.writer.scalars(step, values)
        self._times = []

    def _end(self) -> None:
        if self._times:
            self._write(self.state.step)
