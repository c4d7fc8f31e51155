"""Fits under gradient accumulation with forced overflows, for tests/record/test_accumulation.py.

Run as ``KERAS_BACKEND=<backend> python tests/record/accumulation_fit.py OUT_DIR`` (Keras fixes its
backend at import). A Dense network under mixed_float16 whose inputs are scaled up 1e4x on chosen
batches (its float16 forward overflows there: the LossScaleOptimizer skips exactly those
batches) is trained with ``Adam(gradient_accumulation_steps=4)``, beside an observer that reads,
after every batch, the optimizer's own state: the inner optimizer's raw step counter
(``_iterations``: it advances on every batch the optimizer took, applied or accumulated, and not
on a skip), its public ``iterations`` (raw // 4: the updates applied) and the loss scale. That is
the truth the test compares mpwatch's records with. Writes ``OUT_DIR/truth.json`` and the logdirs
``OUT_DIR/accumulate`` (every batch logged) and ``OUT_DIR/accumulate_every5``.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import mpwatch

BATCHES, BATCH, STEPS = 24, 8, 4
OVERFLOW_BATCHES = {2, 3, 9, 17}  # 0-based training batches whose inputs overflow float16


def _value(v):
    return keras.ops.convert_to_numpy(v.value if hasattr(v, "value") else v)


class Observer(keras.callbacks.Callback):
    """After each batch: the optimizer's raw step counter, its public iterations, the scale."""

    def __init__(self):
        super().__init__()
        self.raw, self.iterations, self.scale = [], [], []

    def on_train_batch_end(self, batch, logs=None):
        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()
        opt = self.model.optimizer
        self.raw.append(int(_value(opt.inner_optimizer._iterations)))
        self.iterations.append(int(_value(opt.iterations)))
        self.scale.append(float(_value(opt.dynamic_scale)))


def model_and_data():
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(h))
    model.compile(keras.optimizers.Adam(1e-3, gradient_accumulation_steps=STEPS), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * BATCH, 16)).astype("float32")
    for b in OVERFLOW_BATCHES:
        x[b * BATCH : (b + 1) * BATCH] *= 1e4  # float16 overflows in the first Dense: inf loss
    y = rng.normal(size=(BATCHES * BATCH, 1)).astype("float32")
    return model, x, y


def fit(logdir, log_every):
    model, x, y = model_and_data()
    observer = Observer()
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=log_every, probe=False, profile=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[monitor, observer])  # fmt: skip
    return {"raw": observer.raw, "iterations": observer.iterations, "scale": observer.scale}


def main(out):
    truth = {
        "accumulate": fit(os.path.join(out, "accumulate"), 1),
        "accumulate_every5": fit(os.path.join(out, "accumulate_every5"), 5),
    }
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
