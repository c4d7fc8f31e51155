"""Trains one model under Keras' JAX backend on 4 host devices, for
tests/record/test_jax_distribution.py: on one device, under ``keras.distribution.DataParallel``,
and under ``ModelParallel`` (a ``LayoutMap`` sharding both Dense kernels over a 2x2 mesh).

Run as ``KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=4 python
tests/jax/jax_distribution.py OUT_DIR`` (both are read when JAX starts: the test runs this in its
own process). Each case trains the same model on the same data twice: with
:class:`mpwatch.MixedPrecisionMonitor` and, beside it, an observer reading the optimizer's own
state after every batch (``jax_state_sync``, then ``dynamic_scale`` and ``iterations``: the
truth); and plain (no callback). Inputs are scaled up 1e4x on chosen batches, so float16
overflows and Keras skips exactly those updates. Writes ``OUT_DIR/truth.json`` (the observer's
series, whether the monitored weights equal the plain fit's bit for bit, each kernel's sharding)
and one logdir per case.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np
from jax_fit import Observer  # the optimizer's own state after every batch (the truth)

import mpwatch

assert keras.backend.backend() == "jax", keras.backend.backend()

OVERFLOW_BATCHES = {2, 3, 9, 17}  # 0-based batches whose inputs overflow float16
BATCHES = 24


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * 8, 16)).astype("float32")
    for b in OVERFLOW_BATCHES:
        x[b * 8 : (b + 1) * 8] *= 1e4  # float16 overflows in the first Dense: inf loss
    y = rng.normal(size=(BATCHES * 8, 1)).astype("float32")
    return x, y


def build_model():
    """The model of every case (built under the distribution in force)."""
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu", name="d1")(inp)
    out = keras.layers.Dense(1, dtype="float32", name="out")(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def distribution(case):
    devices = keras.distribution.list_devices()
    if case == "single":
        return None
    if case == "data_parallel":
        return keras.distribution.DataParallel(devices=devices)
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout["d1/kernel"] = (None, "model")
    layout["out/kernel"] = ("model", None)
    return keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")


def fit(case, logdir=None):
    """The model trained under ``case``'s distribution: (observer or None, weights, shardings)."""
    keras.distribution.set_distribution(distribution(case))
    try:
        model = build_model()
        callbacks, observer = [], None
        if logdir is not None:
            observer = Observer()
            callbacks = [
                mpwatch.MixedPrecisionMonitor(
                    logdir, log_every=1, probe_every=8, profile=False, budget=None
                ),
                observer,
            ]
        x, y = data()
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        shardings = {
            v.path: str(getattr(v.value.sharding, "spec", v.value.sharding))
            for v in model.trainable_variables
        }
        return observer, [np.asarray(w) for w in model.get_weights()], shardings
    finally:
        keras.distribution.set_distribution(None)


def main(out):
    truth = {}
    for case in ("single", "data_parallel", "model_parallel"):
        observer, weights, shardings = fit(case, os.path.join(out, case))
        _, plain, _ = fit(case)
        truth[case] = {
            "scale": observer.scale,
            "iterations": observer.iterations,
            "weights_equal_plain": all(np.array_equal(a, b) for a, b in zip(weights, plain)),
            "shardings": shardings,
            "devices": len(keras.distribution.list_devices()),
        }
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
