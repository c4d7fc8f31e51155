"""A monitor is invisible: what the user sees of a fit is bit-identical with and without mpwatch.

The experiment for ``tests/record/test_invisible.py``, on whichever Keras backend this process
imported (the test runs it in-process on TensorFlow, and as
``KERAS_BACKEND=jax python tests/invisible_fit.py OUT.npz`` on JAX, which saves the comparison).

The model has what a monitor could disturb: two outputs compiled with ``loss_weights`` (Keras
keeps one loss tracker per output), metrics per output, a Dropout layer (its ``SeedGenerator``
state), BatchNormalization (moving statistics), Adam under a dynamic ``LossScaleOptimizer`` whose
scale grows every 3 steps (so the scale variable really changes), trained under ``mixed_float16``
for 2 epochs of 12 batches with validation, the probe every 5 batch steps (mid-epoch). Both fits
build their model from the same seed; :func:`snapshot` takes everything the user can read
afterwards: ``History``, every model variable (weights, moving statistics, seed states), every
metric variable, every optimizer variable (loss scale, its step counter, Adam's moments and
iterations), and the next draws of Python's, numpy's and Keras' global random streams.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import keras
import numpy as np

SEED = 7
SAMPLES, BATCH, EPOCHS = 96, 8, 2  # 12 batches an epoch
PROBE_EVERY = 5  # probes at batch steps 5, 10 (mid-epoch), 12 (epoch end), 15, 20, 24
LOSS_WEIGHTS = {"reg": 0.3, "cls": 2.0}


def data() -> tuple[Any, Any, Any]:
    """(x, {output: y}, validation data): fixed numpy arrays."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(SAMPLES + 16, 6)).astype("float32")
    reg = (x[:, :1] * 3.0 + rng.normal(size=(SAMPLES + 16, 1))).astype("float32")
    cls = (x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")
    y = {"reg": reg[:SAMPLES], "cls": cls[:SAMPLES]}
    val = (x[SAMPLES:], {"reg": reg[SAMPLES:], "cls": cls[SAMPLES:]})
    return x[:SAMPLES], y, val


def build() -> keras.Model:
    """The two-output model, compiled; weights and seeds from ``SEED``."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((6,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.3, name="drop")(h)
    reg = keras.layers.Dense(1, dtype="float32", name="reg")(h)
    cls = keras.layers.Dense(3, activation="softmax", dtype="float32", name="cls")(h)
    model = keras.Model(inp, {"reg": reg, "cls": cls})
    opt = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(1e-2), initial_scale=2.0**10, dynamic_growth_steps=3
    )
    model.compile(
        opt,
        loss={"reg": "mse", "cls": "sparse_categorical_crossentropy"},
        loss_weights=LOSS_WEIGHTS,
        metrics={"reg": ["mae"], "cls": ["accuracy"]},
    )
    return model


def snapshot(model: keras.Model, history: keras.callbacks.History) -> dict[str, Any]:
    """Everything the user can read after the fit, as numpy arrays (keys name each value)."""
    out: dict[str, Any] = {}
    for k, v in history.history.items():
        out[f"history/{k}"] = np.asarray(v)
    for group, variables in (
        ("model", model.variables),  # weights, moving statistics, seed generator states
        ("metrics", model.metrics_variables),
        ("optimizer", model.optimizer.variables),  # loss scale, its counter, Adam's slots
    ):
        for i, v in enumerate(variables):
            # by position and name; the optimizer's and seed generators' paths carry a counter
            # that differs between the two models, the metrics' paths name their output
            name = v.path if group == "metrics" else v.name
            out[f"{group}/{i}/{name}"] = np.array(v)
    out["rng/python"] = np.asarray(random.random())
    out["rng/numpy"] = np.asarray(np.random.random())
    out["rng/keras"] = np.asarray(keras.random.uniform((3,)))  # the global SeedGenerator
    return out


def fit(callbacks: list[Any]) -> dict[str, Any]:
    """Build, fit with ``callbacks``, snapshot."""
    x, y, val = data()
    model = build()
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=val,
        callbacks=callbacks,
    )
    return snapshot(model, history)


def compare(plain: dict[str, Any], watched: dict[str, Any]) -> list[str]:
    """The keys whose values differ (or exist on one side only): empty when invisible."""
    diff = sorted(set(plain) ^ set(watched))
    for k in sorted(set(plain) & set(watched)):
        a, b = plain[k], watched[k]
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True):
            diff.append(k)
    return diff


def run(log_dir: str, monitor: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plain snapshot, monitored snapshot); ``monitor``: ``"monitor"`` (MixedPrecisionMonitor
    with the probe, no profiler) or ``"probe"`` (ProbeMonitor alone)."""
    import mpwatch

    plain = fit([])
    if monitor == "monitor":
        cb = mpwatch.MixedPrecisionMonitor(
            log_dir, log_every=4, probe_every=PROBE_EVERY, profile=False
        )
    else:
        cb = mpwatch.ProbeMonitor(log_dir, every=PROBE_EVERY)
    watched = fit([cb])
    return plain, watched


def main(out: str) -> None:
    """Run both monitors on this backend; save the differing keys and the probe steps."""
    import json
    import os

    result = {}
    for monitor in ("monitor", "probe"):
        log_dir = os.path.join(os.path.dirname(out), f"invisible_{monitor}")
        plain, watched = run(log_dir, monitor)
        result[monitor] = {
            "differ": compare(plain, watched),
            "keys": sorted(plain),
            "history": {k: v.tolist() for k, v in plain.items() if k.startswith("history/")},
        }
    with open(out, "w") as f:
        json.dump({"backend": keras.backend.backend(), **result}, f)


if __name__ == "__main__":
    main(sys.argv[1])
