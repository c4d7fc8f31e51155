"""Models whose mixed-precision problem has one cause that advice must name, as their users write
them, each with its fix (issue 24): small enough for a CPU, synthetic data made here with a fixed
seed. Four break the train step's own contract, two feed it data float16 cannot hold.

- ``custom_step``: the keras.io guide "Customizing what happens in fit()" ``train_step``
  (TensorFlow), which never calls ``optimizer.scale_loss``; under mixed_float16 Keras'
  ``LossScaleOptimizer`` still divides the gradients by the scale. Fixed: ``scale_loss`` before
  ``tape.gradient``.
- ``gan``: the keras.io GAN "overriding train_step" (small Conv2D discriminator and generator on
  8x8 images), with its own ``d_optimizer`` and ``g_optimizer``; only the compiled optimizer is
  loss-scaled, and it never steps. Fixed: a ``LossScaleOptimizer`` per optimizer and
  ``scale_loss`` per loss.
- ``float16_policy``: an MLP under the pure ``"float16"`` policy (float16 variables, no loss
  scaling) with Adam. Fixed: ``mixed_float16``.
- ``bad_batches``: a CNN under mixed_float16 on data where two batches hold a 1e30 record. Fixed:
  the records filtered out.
- ``unnormalized``: tabular data with raw dollar amounts up to 6e4 into three Dense layers under
  mixed_float16 (each layer's output near float16's maximum; the scaled gradients overflow).
  Fixed: a ``keras.layers.Normalization`` adapted on the training features, first in the model,
  in float32.

``train(name, logdir, fixed=False, epochs=...)`` trains one (with mpwatch's monitor) and returns
``(model, history)``; ``BAD_STEPS`` are the steps of ``bad_batches``' bad batches.

Run them and print the diagnosis of each::

    python examples/cause_models.py [NAME ...] [--fixed] [--logdir logs/contract]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

NAMES = ("custom_step", "gan", "float16_policy", "bad_batches", "unnormalized")
BATCH = 32
BAD_BATCHES = (5, 12)  # 0-based batch indices of bad_batches' 1e30 records
BAD_STEPS = tuple(b + 1 for b in BAD_BATCHES)  # their mpwatch steps (1 for the first batch)


@contextlib.contextmanager
def policy_scope(name: str) -> Iterator[None]:
    import keras

    old = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


# --- the keras.io custom train_step ----------------------------------------------------------
def custom_step_model(fixed: bool = False) -> Any:
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
                if fixed:
                    loss = self.optimizer.scale_loss(loss)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply(gradients, trainable_vars)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(self.compute_loss(y=y, y_pred=y_pred))
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    inputs = keras.Input(shape=(32,))
    h = keras.layers.Dense(64, activation="relu")(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(h)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    return model


def custom_step_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 32)).astype("float32")
    y = (x @ rng.normal(size=(32, 1)) + 5.0).astype("float32")
    return x, y


# --- the keras.io GAN --------------------------------------------------------------------------
LATENT = 16


def gan_model(fixed: bool = False) -> Any:
    import keras
    import tensorflow as tf

    disc = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, strides=2, padding="same"),
        keras.layers.LeakyReLU(0.2),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(1),
    ], name="discriminator")  # fmt: skip
    gen = keras.Sequential([
        keras.Input((LATENT,)),
        keras.layers.Dense(4 * 4 * 16),
        keras.layers.LeakyReLU(0.2),
        keras.layers.Reshape((4, 4, 16)),
        keras.layers.Conv2DTranspose(16, 4, strides=2, padding="same"),
        keras.layers.LeakyReLU(0.2),
        keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
    ], name="generator")  # fmt: skip

    class GAN(keras.Model):
        def __init__(self, discriminator: Any, generator: Any, latent_dim: int) -> None:
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.seed_generator = keras.random.SeedGenerator(1337)

        def compile(self, d_optimizer: Any, g_optimizer: Any, loss_fn: Any) -> None:
            super().compile()
            if fixed:
                d_optimizer = keras.optimizers.LossScaleOptimizer(d_optimizer)
                g_optimizer = keras.optimizers.LossScaleOptimizer(g_optimizer)
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self) -> list[Any]:
            return [self.d_loss_tracker, self.g_loss_tracker]

        def _scaled(self, opt: Any, loss: Any) -> Any:
            return opt.scale_loss(loss) if fixed else loss

        def train_step(self, real_images: Any) -> Any:
            if isinstance(real_images, tuple):
                real_images = real_images[0]
            batch_size = tf.shape(real_images)[0]
            z = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
            generated = tf.cast(self.generator(z), real_images.dtype)
            combined = tf.concat([generated, real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined))
                scaled = self._scaled(self.d_optimizer, d_loss)
            grads = tape.gradient(scaled, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            z = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                preds = self.discriminator(self.generator(z))
                g_loss = self.loss_fn(tf.zeros((batch_size, 1)), preds)
                scaled = self._scaled(self.g_optimizer, g_loss)
            grads = tape.gradient(scaled, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    model = GAN(disc, gen, LATENT)
    model.compile(
        d_optimizer=keras.optimizers.Adam(3e-4),
        g_optimizer=keras.optimizers.Adam(3e-4),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def gan_data() -> tuple[np.ndarray, None]:
    return np.random.default_rng(0).random((640, 8, 8, 1)).astype("float32"), None


# --- the pure float16 policy -------------------------------------------------------------------
def float16_policy_model(fixed: bool = False) -> Any:
    import keras

    # built under the user's own set_global_policy: "float16" (OWN_POLICY), "mixed_float16" fixed
    model = keras.Sequential([
        keras.Input((20,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
    ])  # fmt: skip
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
    return model


def float16_policy_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 20)).astype("float32")
    y = (x[:, :5].sum(axis=1) > 0).astype("float32")[:, None]
    return x, y


# --- bad batches -------------------------------------------------------------------------------
def bad_batches_model(fixed: bool = False) -> Any:
    import keras

    inp = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(16, 3, activation="relu")(inp)
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Dense(32, activation="relu")(h)
    out = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(10)(h))
    model = keras.Model(inp, out)
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def bad_batches_data(fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40 * BATCH, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 10, len(x))
    bad = [b * BATCH + 3 for b in BAD_BATCHES]
    x[bad] = 1e30
    if fixed:  # what the finding's fix does: drop the records with values beyond float16's range
        keep = np.abs(x).reshape(len(x), -1).max(axis=1) < 65504.0
        x, y = x[keep], y[keep]
    return x, y


# --- unnormalized tabular data ----------------------------------------------------------------
def unnormalized_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    amount = rng.uniform(0, 6e4, size=(2048, 4))  # raw dollar amounts
    count = rng.integers(0, 20, size=(2048, 4))
    x = np.concatenate([amount, count], axis=1).astype("float32")
    y = (amount[:, 0] > 3e4).astype("float32")[:, None]
    return x, y


def unnormalized_model(fixed: bool = False) -> Any:
    import keras

    inp = keras.Input((8,))
    h = inp
    if fixed:  # the finding's fix: Normalization adapted on the training features, in float32
        norm = keras.layers.Normalization(dtype="float32")
        norm.adapt(unnormalized_data()[0])
        h = norm(h)
    for i in (1, 2, 3):
        h = keras.layers.Dense(64, activation="relu", name=f"hidden{i}")(h)
    out = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="out")(h)
    model = keras.Model(inp, out)
    model.compile("adam", "binary_crossentropy")
    return model


# --- training ----------------------------------------------------------------------------------
POLICY = {"custom_step": "mixed_float16", "gan": "mixed_float16", "float16_policy": None,
          "bad_batches": "mixed_float16", "unnormalized": "mixed_float16"}  # fmt: skip
#: a scenario whose model the user's own code builds under a policy of its own: (as written,
#: fixed); the fit runs under POLICY's (None: float32) as before
OWN_POLICY = {"float16_policy": ("float16", "mixed_float16")}
EPOCHS = {"custom_step": 3, "gan": 2, "float16_policy": 3, "bad_batches": 1, "unnormalized": 1}
BATCHES = {"unnormalized": 64}
PROBE_EVERY = {"unnormalized": 8}


def build(name: str, fixed: bool = False, policy: str | None = None) -> tuple[Any, Any, Any]:
    """(model, x, y) of one scenario, built under its policy (or ``policy``)."""
    import keras

    keras.utils.set_random_seed(0)
    own = OWN_POLICY.get(name)
    with policy_scope(policy or (own[fixed] if own else None) or POLICY[name] or "float32"):
        model = globals()[f"{name}_model"](fixed)
    data = bad_batches_data(fixed) if name == "bad_batches" else globals()[f"{name}_data"]()
    return model, data[0], data[1]


def train(name: str, logdir: str, fixed: bool = False, epochs: int | None = None,
          model: Any = None) -> tuple:  # fmt: skip
    """Train one scenario with mpwatch's monitor into ``logdir``: ``(model, history)``.
    ``model``: train this one instead of building it (a model the diagnosis' fix was applied
    to)."""
    import mpwatch

    built, x, y = build(name, fixed)
    model = built if model is None else model
    every = PROBE_EVERY.get(name, 20)
    monitor = mpwatch.MixedPrecisionMonitor(
        logdir, log_every=min(10, every), probe_every=every, profile=False
    )
    with policy_scope(POLICY[name] or "float32"):
        history = model.fit(x, y, batch_size=BATCHES.get(name, BATCH), verbose=0, shuffle=False,
                            epochs=epochs or EPOCHS[name], callbacks=[monitor])  # fmt: skip
    return model, history


def main(argv: list[str] | None = None) -> None:
    import os

    import mpwatch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(NAMES), help=", ".join(NAMES))
    ap.add_argument("--fixed", action="store_true", help="train each with its fix applied")
    ap.add_argument("--logdir", default="logs/contract")
    args = ap.parse_args(argv)
    for name in args.names:
        logdir = os.path.join(args.logdir, name + ("_fixed" if args.fixed else ""))
        _, history = train(name, logdir, fixed=args.fixed)
        losses = {k: [round(v, 4) for v in vs] for k, vs in history.history.items()}
        print(f"== {name}{' (fixed)' if args.fixed else ''}: {losses}")
        for f in mpwatch.diagnose(logdir):
            print(f"  {f.severity:7s} {f.title}  [{f.rule}]")


if __name__ == "__main__":
    main()
