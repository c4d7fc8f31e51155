"""Bad input gets a clear error before training starts; a failure while recording is logged once,
that part stops, training goes on."""

from __future__ import annotations

import logging

import numpy as np
import pytest


def _fit_3_epochs(monitor):
    """Three epochs of 6 batches of a small compiled model under the monitor; Keras' history."""
    return _compiled().fit(
        np.random.rand(60, 4).astype("float32"),
        np.random.rand(60, 2).astype("float32"),
        batch_size=10,
        epochs=3,
        verbose=0,
        callbacks=[monitor],
    )


def _compiled():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


def test_unwritable_log_dir(tmp_path):
    import mpwatch

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="log_dir .* is not a writable directory"):
        mpwatch.MixedPrecisionMonitor(log_dir=str(blocker / "run"))


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True])
def test_invalid_log_every(tmp_path, bad):
    import mpwatch

    with pytest.raises(ValueError, match="log_every must be a positive integer"):
        mpwatch.MixedPrecisionMonitor(log_dir=tmp_path, log_every=bad)
    with pytest.raises(ValueError, match="log_every must be a positive integer"):
        mpwatch.GradientHealthMonitor(log_dir=tmp_path, log_every=bad)


def test_log_dir_must_be_a_path():
    import mpwatch

    with pytest.raises(ValueError, match="log_dir must be a directory path"):
        mpwatch.LossScaleMonitor(log_dir=None)


def test_not_a_keras_model(tmp_path):
    import mpwatch

    cb = mpwatch.MixedPrecisionMonitor(tmp_path)
    cb.set_model(object())
    with pytest.raises(TypeError, match="watches a keras.Model, got builtins.object"):
        cb.on_train_begin()


def test_uncompiled_model(tmp_path):
    import keras

    import mpwatch

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    cb = mpwatch.MixedPrecisionMonitor(tmp_path)
    cb.set_model(model)
    with pytest.raises(ValueError, match="model 'plain' is not compiled; call model.compile"):
        cb.on_train_begin()
    rec = mpwatch.TrainingLoopRecorder
    with pytest.raises(ValueError, match="is not compiled|has no optimizer"):
        rec(model, log_dir=tmp_path)


def test_failure_while_recording_is_logged_once_and_training_goes_on(
    tmp_path, policy, read_events, caplog, monkeypatch
):
    import mpwatch
    from mpwatch.record.callbacks import gradient_health

    calls = []

    def broken(self, got, logs):
        calls.append(got.steps)
        raise RuntimeError("boom in gradient health")

    monkeypatch.setattr(gradient_health.GradientHealthMonitor, "_batch_end", broken)
    with policy("mixed_float16"), caplog.at_level(logging.ERROR, logger="mpwatch"):
        history = _fit_3_epochs(mpwatch.MixedPrecisionMonitor(tmp_path, log_every=2))
    assert len(history.history["loss"]) == 3  # training completed
    assert len(calls) == 1  # that part stopped after its first failure
    errors = [r for r in caplog.records if r.name == "mpwatch" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "gradient_health" in errors[0].getMessage()
    scalars, records = read_events(tmp_path)
    assert len(scalars["mpwatch/loss_scale"]) == 1 + 18  # the other parts went on (0: the start)
    assert "mpwatch/grad/zero_fraction" not in scalars
    ((_, notice),) = [n for n in records["notice"] if n[1]["part"] == "gradient_health"]
    assert notice["level"] == "error" and "boom in gradient health" in notice["message"]


def test_a_failed_event_write_loses_that_batch_ends_events_not_training(
    tmp_path, policy, read_events, caplog, monkeypatch
):
    """What a batch end writes goes out in one write at its end: when that write fails (a full
    disk), training goes on, the error is logged once, those events are lost and later ones are
    written."""
    import mpwatch
    from mpwatch import contract
    from mpwatch.record.runtime.writer import RunWriter

    original, failed = RunWriter._write_pending, []

    def full_disk_once(self):
        kept = [s for tag, s, _ in self._scalars if tag == contract.LOSS_SCALE]
        if not failed and kept and min(kept) >= 6:  # the write of the interval after step 6
            failed.append(kept)
            self._scalars, self._records = [], []
            raise OSError(28, "No space left on device")
        return original(self)

    monkeypatch.setattr(RunWriter, "_write_pending", full_disk_once)
    with policy("mixed_float16"), caplog.at_level(logging.ERROR, logger="mpwatch"):
        history = _fit_3_epochs(mpwatch.MixedPrecisionMonitor(tmp_path, log_every=2, profile=False))
    assert len(history.history["loss"]) == 3  # training completed
    errors = [r for r in caplog.records if r.name == "mpwatch" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "No space left" in errors[0].getMessage()
    scalars, _ = read_events(tmp_path)
    steps = [s for s, _ in scalars["mpwatch/loss_scale"]]
    assert steps == [s for s in range(19) if s not in failed[0]]  # that write's steps lost
    assert len(failed[0]) == 2 and max(steps) == 18  # one interval (log_every 2); later ones kept


def test_a_train_step_whose_loss_is_not_one_number_trains_on(tmp_path, policy, read_events, caplog):
    """A custom ``train_step`` may return any tensor as its "loss" (here the per-sample losses):
    the loss is not recorded (said once), the other records are, and the fit is never stopped:
    neither at the calls where the monitor's parts have work nor at the quiet ones between."""
    import keras
    import tensorflow as tf

    import mpwatch
    from mpwatch import contract

    class PerSample(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                per_sample = keras.ops.mean(keras.ops.square(self(x, training=True) - y), axis=1)
                loss = self.optimizer.scale_loss(keras.ops.mean(per_sample))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return {"loss": per_sample}

    with policy("mixed_float16"), caplog.at_level(logging.WARNING, logger="mpwatch"):
        inp = keras.Input((4,))
        model = PerSample(inp, keras.layers.Dense(2, dtype="float32")(keras.layers.Dense(8)(inp)))
        model.compile("sgd", "mse")
        history = model.fit(
            np.random.rand(60, 4).astype("float32"),
            np.random.rand(60, 2).astype("float32"),
            batch_size=10,
            epochs=3,
            verbose=0,
            callbacks=[mpwatch.MixedPrecisionMonitor(tmp_path, log_every=4, profile=False)],
        )
    assert len(history.history["loss"]) == 3  # training completed
    said = [r for r in caplog.records if r.name == "mpwatch" and "not one number" in r.getMessage()]
    assert len(said) == 1
    scalars, _ = read_events(tmp_path)
    assert contract.TRAIN_LOSS not in scalars
    assert [s for s, _ in scalars[contract.LOSS_SCALE]] == list(range(19))  # 0: the start


def test_a_fit_that_raised_loses_nothing_for_the_next(tmp_path, policy, read_events):
    """A fit stopped by an exception (a KeyboardInterrupt at its 11th batch: Keras skips the
    callbacks' on_train_end), then a whole fit with the same monitor: the second trains, the
    steps continue the first's, and every batch's loss is recorded at its step, the raised fit's
    last ones (after its last interval) included, as Keras' own logs gave them."""
    import keras

    import mpwatch
    from mpwatch import contract

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 10:
                raise KeyboardInterrupt("a user stopped the fit")

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(float(logs["loss"]))

    rng = np.random.default_rng(0)
    x, y = rng.random((240, 4), np.float32), rng.random((240, 2), np.float32)
    truth = Losses()
    with policy("mixed_float16"):
        model = _compiled()
        monitor = mpwatch.MixedPrecisionMonitor(tmp_path, log_every=7, profile=False, probe=False)
        with pytest.raises(KeyboardInterrupt):
            model.fit(x, y, batch_size=10, verbose=0, callbacks=[monitor, truth, Interrupt()])
        model.fit(x, y, batch_size=10, verbose=0, callbacks=[monitor, truth])
    scalars, _ = read_events(tmp_path)
    assert [s for s, _ in scalars[contract.LOSS_SCALE]] == list(range(35))  # 0: the start
    assert scalars[contract.TRAIN_LOSS] == [(i + 1, v) for i, v in enumerate(truth.seen)]
    assert len(truth.seen) == 34
