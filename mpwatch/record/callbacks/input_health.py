"""InputHealthMonitor: each batch's input health, so a bad batch is named by its step.

A batch whose features hold NaN or inf, or values far outside float16's range (raw amounts, a
corrupted record, 1e30 placeholders), makes a float16 forward pass non-finite: the step is
skipped and the loss scale halves, whatever the model. The tap
(:func:`mpwatch.record.tap.tap_common.input_health`, inside the traced train step, before the user's
``train_step``) reduces the batch's floating-point features (``x`` of ``(x, y, sample_weight)``;
integer ids are left out) to two numbers, stored in its ring with the step's loss scale and skip
flag and read with them once per interval:

- ``mpwatch/input/max_abs``: max |x| over the finite elements;
- ``mpwatch/input/nonfinite_count``: elements that are inf or NaN.

Both per step, so the judge can put each skipped step beside its batch. Cost: one reduction over
the batch's features per step, in the graph. A custom training loop
(:class:`mpwatch.TrainingLoopRecorder`) has no Keras ``train_step`` for the tap to see: nothing is
written there.
"""

from __future__ import annotations

import math
from typing import Any

from mpwatch import contract
from mpwatch.record.callbacks.base import RecordingCallback


class InputHealthMonitor(RecordingCallback):
    """Writes each batch's input health (max |x|, non-finite count of its float features), per
    step, once per ``log_every`` interval.

    Args:
        log_dir: the run directory.
        log_every: interval in batch steps between writes (every step is written).

    Example:
        >>> import keras, numpy as np, tempfile, mpwatch
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> logdir = tempfile.mkdtemp()
        >>> x = np.ones((8, 4), "float32"); x[5, 0] = 3e4
        >>> _ = model.fit(x, np.ones((8, 1)), batch_size=4, verbose=0,
        ...               callbacks=[InputHealthMonitor(logdir)])
        >>> mpwatch.load_run(logdir).scalar("mpwatch/input/max_abs").tolist()
        [1.0, 30000.0]
    """

    part = "input_health"
    reads_tap = True

    def __init__(self, log_dir: Any, log_every: int = 50) -> None:
        super().__init__(log_dir, log_every)
        self._steps: list[int] = []
        self._max: list[float] = []
        self._bad: list[float] = []

    def _begin(self) -> None:
        self._steps, self._max, self._bad = [], [], []

    def _tap_data(self, got: Any) -> None:
        if got.input_max_abs is None:
            return
        for s, mx, bad in zip(got.steps, got.input_max_abs, got.input_nonfinite):
            if math.isnan(float(mx)):
                continue  # the tap did not see this batch's input
            self._steps.append(s)
            self._max.append(float(mx))
            self._bad.append(float(bad))
            if s % self.log_every == 0:
                self._flush()

    def _flush(self) -> None:
        self.writer.scalar_series(contract.INPUT_MAX_ABS, self._steps, self._max)
        self.writer.scalar_series(contract.INPUT_NONFINITE_COUNT, self._steps, self._bad)
        self._steps, self._max, self._bad = [], [], []

    def _end(self) -> None:
        if self._steps:
            self._flush()
