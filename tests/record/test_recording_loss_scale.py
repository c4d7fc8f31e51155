"""Loss scale and skipped steps against the optimizer's own state (ground truth read by a test
callback), with steps_per_execution 1 and 4, across several fit calls, under the three policies.

``mpwatch/loss_scale`` at step s is the scale after step s; at step 0, written once by a run's
first fit, the scale before its first step."""

from __future__ import annotations

import numpy as np
import pytest


def _data(n=120, bad_batches=(), batch=10, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 8), dtype=np.float32)
    y = rng.integers(0, 3, n)
    for b in bad_batches:  # a huge input makes the float16 forward/backward overflow: inf gradients
        x[b * batch] = 1e30
    return x, y


def _model(spe=1):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy", steps_per_execution=spe
    )
    return model


class Truth:
    """Reads dynamic_scale and iterations after every Keras batch call (steps_per_execution=1),
    and the scale before the first batch runs (``before``)."""

    def __new__(cls):
        import keras

        class _Truth(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.scales, self.iterations = [], []
                self.before = None

            def on_train_batch_begin(self, batch, logs=None):
                if self.before is None:  # Keras builds the optimizer in the first train step:
                    opt = self.model.optimizer  # until then dynamic_scale is its initial_scale
                    built = getattr(opt, "dynamic_scale", None)
                    self.before = float(opt.initial_scale if built is None else built.numpy())

            def on_train_batch_end(self, batch, logs=None):
                opt = self.model.optimizer
                self.scales.append(float(opt.dynamic_scale.numpy()))
                self.iterations.append(int(opt.iterations.numpy()))

        return _Truth()


def test_loss_scale_equals_dynamic_scale_each_step(tmp_path, policy, read_events):
    import mpwatch

    with policy("mixed_float16"):
        x, y = _data(bad_batches=(1, 4, 5, 9))
        model = _model()
        truth = Truth()
        model.fit(
            x,
            y,
            batch_size=10,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[mpwatch.LossScaleMonitor(tmp_path, log_every=4), truth],
        )
    scalars, _ = read_events(tmp_path)
    steps = [s for s, _ in scalars["mpwatch/loss_scale"]]
    assert steps == list(range(0, 13))  # step 0: before the first step
    assert truth.before == model.optimizer.initial_scale == 2.0**15
    assert [v for _, v in scalars["mpwatch/loss_scale"]] == [truth.before, *truth.scales]
    # skipped = iterations did not advance
    its = [0, *truth.iterations]
    expected_skips = [float(its[i + 1] == its[i]) for i in range(12)]
    assert [v for _, v in scalars["mpwatch/step_skipped"]] == expected_skips
    assert sum(expected_skips) == 4
    assert scalars["mpwatch/skipped_steps"] == [(4, 1.0), (8, 2.0), (12, 1.0)]
    assert scalars["mpwatch/skipped_steps_total"] == [(4, 1.0), (8, 3.0), (12, 4.0)]


def test_an_epochs_last_partial_call_counts_its_own_batches(tmp_path, policy, read_events):
    """11 batches an epoch with steps_per_execution 4: Keras' last call of each epoch runs 3
    batches, though the end index it passes says 4 (begin + 4 - 1). The steps counted on the
    host (the training loss is written at each call's last step) follow the batches run, as the
    optimizer's iterations do, with no tap read in between to correct them."""
    import mpwatch

    with policy("mixed_float16"):
        x, y = _data(n=110)
        model = _model(4)
        model.fit(
            x, y, batch_size=10, epochs=2, shuffle=False, verbose=0,
            callbacks=[mpwatch.MixedPrecisionMonitor(tmp_path, log_every=100, probe=False,
                                                     profile=False)],
        )  # fmt: skip
        assert int(model.optimizer.iterations.numpy()) == 22  # nothing overflowed
    scalars, _ = read_events(tmp_path)
    assert [s for s, _ in scalars["mpwatch/train/loss"]] == [4, 8, 11, 15, 19, 22]


@pytest.mark.parametrize("log_every", [5, 100])
def test_an_epochs_short_last_call_of_unknown_length_counts_its_own_batches(
    tmp_path, policy, read_events, log_every
):
    """Data of unknown length (``tf.data`` from a generator of 10 batches), steps_per_execution
    4, three epochs: each epoch's last call runs 2 batches, though Keras' indices say 4 and the
    fit's params say nothing of the epoch's length. Each call's loss is written at its last
    batch's step (the optimizer's iterations after the call, read by a test callback) with the
    value Keras logged; with tap reads every 5 steps (one falls in a short call) and with none
    before the fit's end. Before, the short calls' losses went to 12, 22 and 32 (reads every 5
    steps) or 12, 24 and 36 (none)."""
    import keras
    import tensorflow as tf

    import mpwatch

    class Calls(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_train_batch_end(self, batch, logs=None):
            iterations = int(self.model.optimizer.iterations.numpy())
            self.calls.append((iterations, float(logs["loss"])))

    x, y = _data(n=100)

    def batches():
        for b in range(10):
            yield x[10 * b : 10 * (b + 1)], y[10 * b : 10 * (b + 1)]

    data = tf.data.Dataset.from_generator(
        batches, output_signature=(tf.TensorSpec((None, 8)), tf.TensorSpec((None,), tf.int64))
    )
    assert int(data.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    with policy("mixed_float16"):
        model, calls = _model(4), Calls()
        monitor = mpwatch.MixedPrecisionMonitor(
            tmp_path, log_every=log_every, probe=False, profile=False
        )
        model.fit(data, epochs=3, verbose=0, callbacks=[monitor, calls])
    expected = [4, 8, 10, 14, 18, 20, 24, 28, 30]
    assert [i for i, _ in calls.calls] == expected  # nothing overflowed
    scalars, _ = read_events(tmp_path)
    assert scalars["mpwatch/train/loss"] == [(s, v) for s, (_, v) in zip(expected, calls.calls)]


def test_a_steps_per_epoch_longer_than_the_data_counts_the_batches_run(
    tmp_path, policy, read_events
):
    """10 batches of arrays, steps_per_epoch 12, steps_per_execution 4, two epochs: Keras stops
    each epoch when the data runs out (with a warning), inside its third call, which runs 2
    batches where the epoch's length (12) says 4."""
    import mpwatch

    x, y = _data(n=100)
    with policy("mixed_float16"):
        model = _model(4)
        monitor = mpwatch.MixedPrecisionMonitor(tmp_path, log_every=5, probe=False, profile=False)
        history = model.fit(x, y, batch_size=10, epochs=2, steps_per_epoch=12, shuffle=False,
                            verbose=0, callbacks=[monitor])  # fmt: skip
        assert int(model.optimizer.iterations.numpy()) == 20  # nothing overflowed
    scalars, _ = read_events(tmp_path)
    steps = [s for s, _ in scalars["mpwatch/train/loss"]]
    assert steps == [4, 8, 10, 14, 18, 20]
    # each epoch's last loss, Keras' own
    assert [v for s, v in scalars["mpwatch/train/loss"] if s in (10, 20)] == pytest.approx(
        history.history["loss"], rel=1e-6
    )


@pytest.mark.parametrize("spe", [1, 4])
def test_k_overflowing_batches_give_k_skipped_steps(tmp_path, policy, read_events, spe):
    import mpwatch

    bad = (0, 3, 6, 7, 10)  # batch 10 is in the last, partial execution when spe=4 (11 batches)
    with policy("mixed_float16"):
        x, y = _data(n=110, bad_batches=bad)
        model = _model(spe)
        model.fit(
            x,
            y,
            batch_size=10,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[mpwatch.LossScaleMonitor(tmp_path, log_every=100)],
        )
        final_iterations = int(model.optimizer.iterations.numpy())
    scalars, _ = read_events(tmp_path)
    skipped = dict(scalars["mpwatch/step_skipped"])
    assert sorted(skipped) == list(range(1, 12))
    assert [s for s, v in sorted(skipped.items()) if v == 1.0] == [b + 1 for b in bad]
    assert final_iterations == 11 - len(bad)
    assert scalars["mpwatch/skipped_steps_total"] == [(11, float(len(bad)))]
    # the scale halves at each skip and never grows here (growth interval 2000)
    scales = dict(scalars["mpwatch/loss_scale"])
    assert sorted(scales) == list(range(0, 12))
    # step 1 overflowed at the initial scale (recorded at step 0), which it halved
    assert (scales[0], scales[1]) == (2.0**15, 2.0**14)
    assert scales[11] == 2.0**15 / 2 ** len(bad)


def test_several_fit_calls_continue_steps(tmp_path, policy, read_events):
    import mpwatch

    with policy("mixed_float16"):
        x, y = _data(n=50, bad_batches=(2,))
        model = _model(spe=2)
        for _ in range(3):
            model.fit(
                x,
                y,
                batch_size=10,
                epochs=1,
                shuffle=False,
                verbose=0,
                callbacks=[mpwatch.MixedPrecisionMonitor(tmp_path, log_every=5)],
            )
    scalars, records = read_events(tmp_path)
    steps = [s for s, _ in scalars["mpwatch/loss_scale"]]
    # 3 fits x 5 batches, no duplicates, no gaps; step 0 (the scale before the first step) written
    # by the first fit only
    assert steps == list(range(0, 16))
    assert scalars["mpwatch/skipped_steps_total"] == [(5, 1.0), (10, 2.0), (15, 3.0)]
    assert [s for s, _ in records["run_info"]] == [0, 5, 10]
    # each later fit starts from the scale recorded at its previous step; the first from the
    # initial scale (run_info's start has none there: Keras builds the optimizer in the first step)
    starts = [info["start"]["loss_scale"] for _, info in records["run_info"]]
    scale = dict(scalars["mpwatch/loss_scale"])
    assert starts[1:] == [scale[5], scale[10]]
    assert scale[0] == records["run_info"][0][1]["loss_scale"]["initial"] == 2.0**15


@pytest.mark.parametrize("name", ["mixed_bfloat16", "float32"])
def test_no_loss_scale_policies_say_so_once(tmp_path, policy, read_events, name):
    import mpwatch

    with policy(name):
        x, y = _data(n=40)
        model = _model()
        for _ in range(2):
            model.fit(
                x,
                y,
                batch_size=10,
                epochs=1,
                verbose=0,
                callbacks=[mpwatch.MixedPrecisionMonitor(tmp_path, log_every=2)],
            )
    scalars, records = read_events(tmp_path)
    assert "mpwatch/loss_scale" not in scalars
    assert "mpwatch/step_skipped" not in scalars
    notices = [p for _, p in records["notice"] if p["part"] == "loss_scale"]
    assert len(notices) == 1
    assert "no loss scale" in notices[0]["message"] and name in notices[0]["message"]
    info = records["run_info"][0][1]
    assert info["policy"] == name and info["loss_scale"]["kind"] == "none"
    # gradient health is still recorded (S = 1)
    assert [s for s, _ in scalars["mpwatch/grad/zero_fraction"]] == [2, 4, 6, 8]


@pytest.mark.parametrize("spe", [1, 4])
@pytest.mark.parametrize("log_every", [1, 7, 50])
def test_series_are_exact_per_batch_and_the_tap_is_read_once_per_interval(
    tmp_path, policy, read_events, monkeypatch, spe, log_every
):
    """The loss scale and skips of every batch, whatever the interval and steps_per_execution,
    while the device is read only at the calls that reach a multiple of ``log_every`` and once at
    the end of the fit (not at every batch). Truth: the overflowing batches are known, so the
    scale after step s is 2**15 halved once per overflow up to s (Keras grows it only after 2000
    good steps), and the optimizer's own state after each Keras call (read by a callback)."""
    import mpwatch
    from mpwatch.record.tap.tf_tap import Tap

    reads = []
    original_read = Tap.read

    def counting_read(self):
        got = original_read(self)
        reads.append(got.steps)
        return got

    monkeypatch.setattr(Tap, "read", counting_read)
    bad = (1, 4, 5, 9, 17)
    batches = 24
    with policy("mixed_float16"):
        x, y = _data(n=10 * batches, bad_batches=bad)
        model = _model(spe)
        truth = Truth()
        monitor = mpwatch.MixedPrecisionMonitor(
            tmp_path, log_every=log_every, probe=False, profile=False
        )
        model.fit(x, y, batch_size=10, shuffle=False, verbose=0, callbacks=[monitor, truth])
    scalars, _ = read_events(tmp_path)
    want = [2.0**15 / 2 ** sum(b < s for b in bad) for s in range(1, batches + 1)]
    assert scalars["mpwatch/loss_scale"] == [(0, 2.0**15)] + [
        (s, v) for s, v in zip(range(1, batches + 1), want)
    ]
    call_ends = list(range(spe, batches + 1, spe))
    assert truth.scales == [want[s - 1] for s in call_ends]  # the optimizer agrees
    skipped = [s for s, v in scalars["mpwatch/step_skipped"] if v == 1.0]
    assert skipped == [b + 1 for b in bad]
    # reads: the calls that reach a multiple of log_every, then one at the end if data is left
    calls = [range(end - spe + 1, end + 1) for end in call_ends]
    expected = [c for c in calls if any(s % log_every == 0 for s in c)]
    if not expected or expected[-1][-1] != batches:
        expected.append(None)
    assert len(reads) == len(expected)
    assert [s for r in reads for s in r] == list(range(1, batches + 1))  # each batch once
    assert len(reads) < batches or log_every == 1 and spe == 1
