"""No retrace per fit: a later mpwatch ``fit`` reuses the tapped train function, a plain ``fit``
in between runs Keras' own, and training is exactly what it is without mpwatch.

Traces are counted where they happen: the model's ``train_step`` runs in Python only while
TensorFlow traces the train function, so a counting wrapper on the instance sees every trace, and
whether mpwatch's tap was in the optimizer at that moment (the trace holds the tap's ops or not).
The truth for the recorded series is the optimizer's own state after every batch."""

from __future__ import annotations

import numpy as np
import pytest


def _data(n=80, bad=(1, 6), batch=10):
    rng = np.random.default_rng(3)
    x = rng.random((n, 8), dtype=np.float32)
    y = rng.integers(0, 3, n)
    for b in bad:  # float16 overflows on these batches: the update is skipped
        x[b * batch] = 1e30
    return x, y


def _model(spe):
    import keras

    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", steps_per_execution=spe
    )
    return model


def _count_traces(model):
    """Wrap the instance's train_step: a list of (fit index, tap present) per trace."""
    traces = []
    original = model.train_step

    def train_step(data):
        opt_apply = model.optimizer.__dict__.get("apply")
        traces.append((model._fit_index, bool(getattr(opt_apply, "_mpwatch_tap", False))))
        return original(data)

    object.__setattr__(model, "train_step", train_step)
    return traces


class Truth:
    def __new__(cls):
        import keras

        class _Truth(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.scales, self.iterations = [], []

            def on_train_batch_end(self, batch, logs=None):
                opt = self.model.optimizer
                self.scales.append(float(opt.dynamic_scale.numpy()))
                self.iterations.append(int(opt.iterations.numpy()))

        return _Truth()


@pytest.mark.parametrize("spe, log_every", [(1, 7), (4, 1)])
def test_later_fits_reuse_the_tapped_function_and_plain_fits_run_keras_own(
    tmp_path, policy, read_events, spe, log_every
):
    import mpwatch

    x, y = _data()
    plan = [True, True, False, True]  # mpwatch, mpwatch, plain, mpwatch
    with policy("mixed_float16"):
        watched, plain = _model(spe), _model(spe)
        traces = _count_traces(watched)
        truths = []
        for i, with_mpwatch in enumerate(plan):
            object.__setattr__(watched, "_fit_index", i)
            truth = Truth()
            cbs = [truth]
            if with_mpwatch:
                cbs.insert(
                    0, mpwatch.MixedPrecisionMonitor(tmp_path, log_every=log_every, profile=False)
                )
            watched.fit(x, y, batch_size=10, shuffle=False, verbose=0, callbacks=cbs)
            plain.fit(x, y, batch_size=10, shuffle=False, verbose=0)
            truths.append(truth)
    # one trace with the tap (fit 0), one clean trace (the plain fit 2), none in fits 1 and 3
    assert traces == [(0, True), (2, False)]
    # mpwatch did not change training: the same weights, bit for bit, as the plain twin's
    for a, b in zip(watched.weights, plain.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the series of the three mpwatch fits: exactly the optimizer's, step after step
    scalars, _ = read_events(tmp_path)
    calls = [t for t, w in zip(truths, plan) if w]
    scales = [s for t in calls for s in t.scales]
    got = scalars["mpwatch/loss_scale"]
    per_call = len(calls[0].scales)
    batches = 8
    assert [s for s, _ in got] == list(range(0, 3 * batches + 1))
    if spe == 1:
        assert [v for _, v in got[1:]] == scales
    else:  # the truth is read per Keras call: the scale after each call's last batch
        assert [v for s, v in got[1:] if s % spe == 0 or s % batches == 0] == scales
    assert per_call == -(-batches // spe)
    # skipped steps: each fit's overflowing batches
    skipped = [s for s, v in scalars["mpwatch/step_skipped"] if v == 1.0]
    assert skipped == [f * batches + b + 1 for f in range(3) for b in (1, 6)]


@pytest.mark.parametrize("spe", [1, 3])
def test_probe_takes_its_batch_without_tracing_the_train_function_again(tmp_path, policy, spe):
    """The probe, given no probe_data, keeps the first training batch as it passes: the train
    function runs once traced, every batch is trained on once and in order (weights equal a plain
    fit's), and the kept batch is the data's first batch."""
    import mpwatch

    x, y = _data(n=75, bad=())  # a partial last batch: the dataset's batch dimension is None
    with policy("mixed_float16"):
        watched, plain = _model(spe), _model(spe)
        traces = _count_traces(watched)
        object.__setattr__(watched, "_fit_index", 0)
        probe = mpwatch.ProbeMonitor(tmp_path, every=4)
        watched.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0, callbacks=[probe])
        plain.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    assert [fit for fit, _ in traces] == [0]  # one trace in all, the first batch's
    for a, b in zip(watched.weights, plain.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    kept_x, kept_y = probe._data[:2]
    np.testing.assert_array_equal(np.asarray(kept_x), x[:10])
    np.testing.assert_array_equal(np.asarray(kept_y), y[:10])
