"""Trains small models under Keras' JAX backend with mpwatch, for tests/record/test_jax_backend.py.

Run as ``KERAS_BACKEND=jax python tests/jax/jax_fit.py OUT_DIR`` (the backend is fixed when keras
is imported, so the TensorFlow test session runs this in its own process). For each case it
trains a model with :class:`mpwatch.MixedPrecisionMonitor` and, beside it, an independent observer
callback that reads the optimizer's own state after every Keras call (``model.jax_state_sync()``,
then ``dynamic_scale`` and ``iterations``): the ground truth the test compares mpwatch's records
with. Writes ``OUT_DIR/truth.json`` and one logdir per case under ``OUT_DIR``.

Cases: ``forced`` (a Dense network under mixed_float16 whose inputs are scaled up 1e4x on chosen
batches, so the float16 forward overflows and Keras skips exactly those updates), with
``steps_per_execution`` 1 and 4 and ``log_every`` 1 and 7; ``softmax`` (a CNN whose float16
softmax output the diagnosis must name).
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import mpwatch

assert keras.backend.backend() == "jax", keras.backend.backend()

OVERFLOW_BATCHES = {2, 3, 9, 17}  # 0-based training batches whose inputs overflow float16


class Observer(keras.callbacks.Callback):
    """After each Keras call: the optimizer's own loss scale and iterations (the truth)."""

    def __init__(self):
        super().__init__()
        self.scale, self.iterations = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.model.jax_state_sync()
        self.scale.append(float(self.model.optimizer.dynamic_scale.numpy()))
        self.iterations.append(int(self.model.optimizer.iterations.numpy()))


def forced(logdir, spe, log_every):
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(inp)
    out = keras.layers.Dense(1, dtype="float32")(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=spe)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24 * 8, 16)).astype("float32")
    for b in OVERFLOW_BATCHES:
        x[b * 8 : (b + 1) * 8] *= 1e4  # float16 overflows in the first Dense: inf loss
    y = rng.normal(size=(24 * 8, 1)).astype("float32")
    observer = Observer()
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=log_every, probe=False, profile=False)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[monitor, observer])
    return {"scale": observer.scale, "iterations": observer.iterations}


def softmax(logdir):
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4, activation="softmax", name="probs"),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 12, 12, 1)).astype("float32")
    y = rng.integers(0, 4, 64)
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=2, profile=False)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[monitor])
    return {"variables": [v.path for v in model.trainable_variables]}


def main(out):
    truth = {}
    for spe, log_every in [(1, 1), (1, 7), (4, 1), (4, 7)]:
        name = f"forced_spe{spe}_every{log_every}"
        truth[name] = forced(os.path.join(out, name), spe, log_every)
    truth["softmax"] = softmax(os.path.join(out, "softmax"))
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
