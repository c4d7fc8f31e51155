"""A train step that never calls ``optimizer.scale_loss``, on a model the probe cannot run (no
forward pass of its own: its train step runs an encoder and a decoder, as keras.io's VAE does).

mpwatch watches the LossScaleOptimizer's ``scale_loss`` while Keras traces the train step (the
``train_step`` record's ``scale_loss_calls``), and the judge says what the missing scale does to
the updates, by optimizer. The claims are checked against the optimizers themselves: one step of
SGD moves each weight by lr x g / S (1/S of the right update; some of them too small for a float32
weight to take at all), Adam's first by lr x g' / (|g'| + eps') with g' = g / S: about lr where
|g| is well above S x eps', less below it (g: the unscaled gradient).
"""

from __future__ import annotations

import numpy as np
import pytest


def _autoencoder(scaled: bool, optimizer):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    encoder = keras.Model(inp, keras.layers.Dense(4, activation="relu")(inp), name="encoder")
    code = keras.Input((4,))
    decoder = keras.Model(code, keras.layers.Dense(8, dtype="float32")(code), name="decoder")

    class AutoEncoder(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = encoder, decoder

        def train_step(self, data):
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                out = self.decoder(self.encoder(x))
                loss = tf.reduce_mean(tf.square(tf.cast(x, "float32") - out))
                if scaled:
                    loss_used = self.optimizer.scale_loss(loss)
                else:
                    loss_used = loss
            grads = tape.gradient(loss_used, self.trainable_weights)
            self.optimizer.apply(grads, self.trainable_weights)
            return {"loss": loss}

    model = AutoEncoder()
    model.compile(optimizer=optimizer)
    return model


def _data():
    return np.random.default_rng(0).normal(size=(48, 8)).astype("float32")


@pytest.fixture(scope="module")
def fits(tmp_path_factory, policy):
    """(optimizer name, scaled) -> (logdir, model), each trained once, 6 steps of 8."""
    import keras

    import mpwatch

    out = {}
    for name, scaled in (("sgd", False), ("adam", False), ("adam", True)):
        logdir = str(tmp_path_factory.mktemp(f"{name}_{'scaled' if scaled else 'unscaled'}"))
        opt = keras.optimizers.SGD(0.01) if name == "sgd" else keras.optimizers.Adam(1e-3)
        with policy("mixed_float16"):
            model = _autoencoder(scaled, opt)
            monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=2)
            model.fit(_data(), batch_size=8, epochs=1, verbose=0, callbacks=[monitor])
        out[(name, scaled)] = (logdir, model)
    return out


@pytest.mark.parametrize(("name", "scaled"), [("sgd", False), ("adam", False), ("adam", True)])
def test_the_record_counts_the_train_steps_scale_loss_calls(fits, read_events, name, scaled):
    logdir, model = fits[(name, scaled)]
    _, records = read_events(logdir)
    _, latest = records["train_step"][-1]
    (compiled,) = [o for o in latest["optimizers"] if o["compiled"]]
    assert latest["has_call"] is False and latest["custom_train_step"] is True
    assert compiled["scale_loss_calls"] == (1 if scaled else 0)
    inner = model.optimizer.inner_optimizer
    assert compiled["epsilon"] == (None if name == "sgd" else pytest.approx(inner.epsilon))
    assert "probe" not in records  # no float32 reference: the trace is the only witness


def _finding(logdir):
    import mpwatch

    return [f for f in mpwatch.diagnose(logdir) if f.rule == "train-step"]


def test_sgd_unscaled_loss_is_an_error_every_update_one_over_the_scale(fits, policy):
    import keras
    import tensorflow as tf

    logdir, model = fits[("sgd", False)]
    (f,) = _finding(logdir)
    scale = float(model.optimizer.dynamic_scale.numpy())
    assert f.severity == "error" and f.data["cause"] == "loss_not_scaled"
    assert f.data["scale_loss_calls"] == 0 and f.data["loss_scale"] == scale
    assert f"1/{scale:.0f}" in f.title and "scale_loss" in f.fix
    # the claim, on SGD itself: one step moves each weight by lr x g / S
    x = _data()[:8]
    with policy("mixed_float16"):
        twin = _autoencoder(False, keras.optimizers.SGD(0.01))
        twin.set_weights(model.get_weights())
        before = [v.numpy().copy() for v in twin.trainable_weights]
        with tf.GradientTape() as tape:
            out = twin.decoder(twin.encoder(x))
            loss = tf.reduce_mean(tf.square(x - out))
        grads = [g.numpy() for g in tape.gradient(loss, twin.trainable_weights)]
        twin.train_on_batch(x)
        s = float(twin.optimizer.dynamic_scale.numpy())
    lost = 0
    for b, a, g in zip(before, twin.trainable_weights, grads):
        expected = (b.astype(np.float64) - 0.01 * g.astype(np.float64) / s).astype(np.float32)
        np.testing.assert_array_max_ulp(a.numpy(), expected, maxulp=1)
        lost += int(((a.numpy() == b) & (g != 0)).sum())
    assert lost > 0  # so small an update that float32 weights do not take some of them at all


def test_adam_unscaled_loss_is_a_warning_naming_its_epsilon_floor(fits, policy):
    import keras
    import tensorflow as tf

    logdir, model = fits[("adam", False)]
    (f,) = _finding(logdir)
    scale = float(model.optimizer.dynamic_scale.numpy())
    eps = float(model.optimizer.inner_optimizer.epsilon)
    assert f.severity == "warning" and f.data["cause"] == "loss_not_scaled"
    assert "1/" not in f.title and "Adam's updates shrink" in f.title
    assert f"{scale * eps:.3g}" in f.evidence and "every 2000 steps" in f.evidence
    # the claim, on Adam itself: its first step moves each weight by lr x g' / (|g'| + eps'),
    # g' = g / S the gradient it gets and eps' = eps / sqrt(1 - beta_2) (Keras adds epsilon to
    # sqrt(v) before the bias correction): the division by S cancels where |g| is well above
    # S x eps', and the update shrinks where |g| is below it
    x = _data()[:8]
    with policy("mixed_float16"):
        twin = _autoencoder(False, keras.optimizers.Adam(1e-3))
        twin.optimizer.build(twin.trainable_weights)
        before = [v.numpy().copy() for v in twin.trainable_weights]
        with tf.GradientTape() as tape:
            out = twin.decoder(twin.encoder(x))
            loss = tf.reduce_mean(tf.square(x - out))
        grads = tape.gradient(loss, twin.trainable_weights)
        g = np.concatenate([g.numpy().ravel() for g in grads]).astype(np.float64)
        s = float(twin.optimizer.dynamic_scale.numpy())
        twin.train_on_batch(x)
    moved = np.concatenate(
        [np.abs(a.numpy() - b).ravel() for b, a in zip(before, twin.trainable_weights)]
    )
    floor = s * eps / np.sqrt(1 - twin.optimizer.inner_optimizer.beta_2)
    live = g != 0
    np.testing.assert_allclose(
        moved[live], 1e-3 * np.abs(g[live]) / (np.abs(g[live]) + floor), rtol=0.02, atol=2e-9
    )
    assert (np.abs(g) > 3 * floor).any() and (moved[np.abs(g) > 3 * floor] > 0.74e-3).all()
    shrunk = live & (np.abs(g) < floor / 2)
    assert shrunk.any() and (moved[shrunk] < 0.34e-3).all()


def test_a_scaled_loss_gives_no_finding(fits):
    logdir, _ = fits[("adam", True)]
    assert _finding(logdir) == []


def _pair(spe=1):
    """Two sub-models, each with a LossScaleOptimizer of its own (as mpwatch's GAN fix has it);
    the train step scales the first one's loss and not the second's. The compiled optimizer
    (Keras' default) is never applied."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    first = keras.Model(inp, keras.layers.Dense(8, dtype="float32")(inp), name="first")
    inp2 = keras.Input((8,))
    second = keras.Model(inp2, keras.layers.Dense(8, dtype="float32")(inp2), name="second")

    class Pair(keras.Model):
        def __init__(self):
            super().__init__()
            self.first, self.second = first, second

        def compile(self):
            super().compile(steps_per_execution=spe)
            self.a_optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
            self.b_optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))

        def train_step(self, data):
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                a_loss = tf.reduce_mean(tf.square(self.first(x) - x))
                scaled = self.a_optimizer.scale_loss(a_loss)
            grads = tape.gradient(scaled, self.first.trainable_weights)
            self.a_optimizer.apply(grads, self.first.trainable_weights)
            with tf.GradientTape() as tape:
                b_loss = tf.reduce_mean(tf.square(self.second(x) - x))
            grads = tape.gradient(b_loss, self.second.trainable_weights)
            self.b_optimizer.apply(grads, self.second.trainable_weights)
            return {"loss": a_loss, "b_loss": b_loss}

    model = Pair()
    model.compile()
    return model


def test_a_gans_own_loss_scale_optimizers_are_watched_each(tmp_path, policy, read_events):
    import mpwatch

    with policy("mixed_float16"):
        model = _pair()
        monitor = mpwatch.MixedPrecisionMonitor(str(tmp_path), log_every=2)
        model.fit(_data(), batch_size=8, epochs=1, verbose=0, callbacks=[monitor])
    _, records = read_events(tmp_path)
    _, latest = records["train_step"][-1]
    calls = {o["name"]: o["scale_loss_calls"] for o in latest["optimizers"]}
    assert calls == {"optimizer": 0, "a_optimizer": 1, "b_optimizer": 0}
    steps = {o["name"]: o["iterations"] - o["iterations_start"] for o in latest["optimizers"]}
    assert steps == {"optimizer": 0, "a_optimizer": 6, "b_optimizer": 6}
    (f,) = _finding(str(tmp_path))
    assert f.severity == "error" and f.data["optimizers"] == ["b_optimizer"]
    assert "b_optimizer.scale_loss" in f.evidence and "a_optimizer" not in f.evidence
    assert "self.b_optimizer.scale_loss(b_loss)" in f.fix and "a_optimizer" not in f.fix


def test_steps_stand_where_the_tap_counts_nothing(tmp_path, policy, read_events):
    """The same model with steps_per_execution 4, two fits of 2 batches: each call runs 2
    batches. The tap counts the compiled optimizer's steps, and it never steps here: its count
    says nothing of the batches run, and the host's count (from Keras' batch indices, clipped to
    the epoch) stands: losses at steps 2 and 4, with Keras' values."""
    import keras

    import mpwatch

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))

    with policy("mixed_float16"):
        model, losses = _pair(spe=4), Losses()
        for _ in range(2):
            monitor = mpwatch.MixedPrecisionMonitor(str(tmp_path), log_every=2)
            model.fit(_data()[:16], batch_size=8, epochs=1, verbose=0,
                      callbacks=[monitor, losses])  # fmt: skip
        assert int(model.a_optimizer.iterations.numpy()) == 4
    scalars, _ = read_events(tmp_path)
    assert scalars["mpwatch/train/loss"] == [(2, losses.losses[0]), (4, losses.losses[1])]


def test_the_record_names_the_keras_family_of_a_users_optimizer(policy):
    import keras

    from mpwatch.record.callbacks.train_step import train_step_facts

    class MyAdam(keras.optimizers.Adam):
        pass

    with policy("mixed_float16"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, dtype="float32")])
        model.compile(MyAdam(1e-3, epsilon=1e-6), "mse")
    (o,) = train_step_facts(model)["optimizers"]
    assert o["class"] == "LossScaleOptimizer(MyAdam)" and o["family"] == "Adam"
    assert o["epsilon"] == pytest.approx(1e-6) and o["scale_loss_calls"] is None
