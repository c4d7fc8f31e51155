"""TrainingLoopRecorder in a custom loop (GradientTape + LossScaleOptimizer) records the same loss
scale and skipped steps as the optimizer's own state."""

from __future__ import annotations

import numpy as np
import pytest


def test_custom_loop_records_loss_scale_and_skips(tmp_path, policy, read_events):
    import keras
    import tensorflow as tf

    import mpwatch

    with policy("mixed_float16"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        loss_fn = keras.losses.MeanSquaredError()
        x = np.random.rand(60, 8).astype("float32")
        y = np.random.rand(60, 1).astype("float32")
        x[20] = 1e30  # batch 3 overflows
        scales, its = [], []
        with mpwatch.TrainingLoopRecorder(model, tmp_path, optimizer=opt, log_every=2) as rec:

            @tf.function
            def train_step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                    scaled = opt.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)
                return loss

            for i in range(6):
                loss = train_step(x[i * 10 : i * 10 + 10], y[i * 10 : i * 10 + 10])
                rec.step_end(loss=loss)
                scales.append(float(opt.dynamic_scale.numpy()))
                its.append(int(opt.iterations.numpy()))
    scalars, records = read_events(tmp_path)
    # step 0: the scale before the first step (the optimizer is built by its first apply, with
    # dynamic_scale = initial_scale)
    before = [(0, float(opt.initial_scale))]
    assert scalars["mpwatch/loss_scale"] == before + [(i + 1, s) for i, s in enumerate(scales)]
    assert [v for _, v in scalars["mpwatch/step_skipped"]] == [0, 0, 1, 0, 0, 0]
    assert its[-1] == 5
    assert [s for s, _ in scalars["mpwatch/grad/zero_fraction"]] == [2, 4, 6]
    assert "layers" in records and "run_info" in records
    rows = records["layers"][-1][1]["layers"]
    assert [r[0] for r in rows["data"]][:2] == [model.layers[0].name, model.layers[1].name]


def test_share_skip_decision_keeps_finite_gradients_and_poisons_all_on_any_nonfinite():
    """One replica here (the multi-worker case, where one worker's overflow must make every worker
    skip, is tests/test_resilience_processes.py's MultiWorkerMirroredStrategy test)."""
    import tensorflow as tf

    import mpwatch

    a = np.array([1.5, -2.0, 6.0e4], dtype="float16")
    b = np.array([[3.0, 0.0]], dtype="float32")
    out = mpwatch.share_skip_decision([tf.constant(a), None, tf.constant(b)])
    assert out[1] is None
    np.testing.assert_array_equal(out[0].numpy(), a)
    np.testing.assert_array_equal(out[2].numpy(), b)
    assert out[0].dtype == tf.float16
    bad = np.array([1.0, np.inf], dtype="float16")
    out = tf.function(mpwatch.share_skip_decision)([tf.constant(bad), tf.constant(b)])
    assert np.isnan(out[0].numpy()).all() and np.isnan(out[1].numpy()).all()


def _loop_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
         keras.layers.Dense(1, dtype="float32")]  # fmt: skip
    )


def test_custom_loop_probe_takes_the_loops_loss_on_a_model_never_compiled(tmp_path, policy):
    """The docs say the model need not be compiled: the probe then takes the loop's loss_fn, and
    its loss on the probe batch is that loss, computed here in float32 by hand."""
    import keras
    import tensorflow as tf

    import mpwatch

    with policy("mixed_float16"):
        model = _loop_model()
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        loss_fn = keras.losses.MeanSquaredError()
        rng = np.random.default_rng(0)
        x = rng.random((40, 8)).astype("float32")
        y = rng.random((40, 1)).astype("float32")
        with mpwatch.TrainingLoopRecorder(
            model, tmp_path, optimizer=opt, log_every=2, loss_fn=loss_fn, probe_every=2,
            probe_data=(x[:10], y[:10]), profile=False,
        ) as rec:  # fmt: skip

            @tf.function
            def train_step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                    scaled = opt.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)
                return loss

            for i in range(4):
                rec.step_end(loss=train_step(x[i * 10 : i * 10 + 10], y[i * 10 : i * 10 + 10]))
    assert model.compiled is False or getattr(model, "loss", None) is None
    run = mpwatch.load_run(str(tmp_path))
    probe = run.latest_probe(reliable_only=False)
    assert probe is not None and probe.step == 4
    with policy("float32"):
        twin = _loop_model()
    twin.set_weights(model.get_weights())
    ref = float(loss_fn(y[:10], twin(x[:10], training=True)))
    assert probe.model["ref_loss"] == pytest.approx(ref, rel=1e-4)
    assert not [n for n in run.notices if n.get("level") == "error"]


def test_custom_loop_probe_without_a_loss_is_a_clear_error(tmp_path, policy):
    import keras

    import mpwatch

    with policy("mixed_float16"):
        model = _loop_model()
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        x = np.ones((4, 8), "float32")
        with pytest.raises(ValueError, match="pass loss_fn="):
            mpwatch.TrainingLoopRecorder(model, tmp_path, optimizer=opt,
                                         probe_data=(x, x[:, :1]))  # fmt: skip
        # without probe data there is nothing to probe: no loss needed
        mpwatch.TrainingLoopRecorder(model, tmp_path / "b", optimizer=opt)
