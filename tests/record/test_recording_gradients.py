"""Gradient health against numpy on gradients of known values.

A bias-free linear model y = x.w, batch of 1, loss c*y: the gradient of w is x*c, and what the
optimizer receives under mixed_float16 is float16(float16(x) * float16(S*c)) with S the loss scale.
With S = 2**15 and c = 2**-20, S*c = 2**-5, and x chosen so that some products are exact, some fall
in
float16's subnormal range, some round to zero."""

from __future__ import annotations

import math

import numpy as np

X = np.array([0.0, 2.0**-22, 2.0**-12, 2.0**-10, 2.0**-9, 1.0, 3.0, 1000.0], np.float32)
C = 2.0**-20
S = 2.0**15


def _truth():
    g = (np.float16(X) * np.float16(S * C)).astype(np.float16).astype(np.float64)
    a = np.abs(g)
    return {
        "zero_fraction": float(np.mean(a == 0)),
        "subnormal_fraction": float(np.mean((a > 0) & (a < 2.0**-14))),
        "nonfinite_count": float(np.sum(~np.isfinite(a))),
        "max_abs": float(a.max()),
        "headroom_bits": math.log2(65504.0 / a.max()),
    }


def _fit(logdir, per_variable=True):
    import keras

    import mpwatch

    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="ones", name="lin"),
        ],
        name="linear",
    )
    model.compile(keras.optimizers.SGD(0.0), loss=lambda yt, yp: keras.ops.sum(yp, axis=-1) * C)
    model.fit(
        X[None, :],
        np.zeros((1, 1), np.float32),
        batch_size=1,
        epochs=1,
        verbose=0,
        callbacks=[mpwatch.GradientHealthMonitor(logdir, log_every=1, per_variable=per_variable)],
    )


def test_gradient_health_matches_numpy(tmp_path, policy, read_events):
    truth = _truth()
    # the construction really spans the cases
    assert truth["zero_fraction"] == 2 / 8 and truth["subnormal_fraction"] == 2 / 8
    with policy("mixed_float16"):
        _fit(tmp_path)
    scalars, records = read_events(tmp_path)
    for key in (
        "zero_fraction",
        "subnormal_fraction",
        "nonfinite_count",
        "max_abs",
        "headroom_bits",
    ):
        ((step, value),) = scalars[f"mpwatch/grad/{key}"]
        assert step == 1
        assert value == np.float32(truth[key]), key
    ((step, rec),) = records["grad_variables"]
    assert rec["loss_scale"] == S
    table = dict(zip(rec["variables"]["columns"], rec["variables"]["data"][0]))
    assert table["variable"].endswith("lin/kernel") and table["size"] == 8
    assert table["layer"] == "linear/lin"
    assert table["zero_fraction"] == truth["zero_fraction"]
    assert table["subnormal_fraction"] == truth["subnormal_fraction"]
    assert table["max_abs"] == truth["max_abs"]


def test_float32_gradients_unscaled(tmp_path, policy, read_events):
    """float32: no loss scale, S = 1: the gradient is x*c exactly (float32)."""
    with policy("float32"):
        _fit(tmp_path, per_variable=False)
    scalars, records = read_events(tmp_path)
    g = np.abs(X.astype(np.float32) * np.float32(C))
    ((_, zero),) = scalars["mpwatch/grad/zero_fraction"]
    ((_, sub),) = scalars["mpwatch/grad/subnormal_fraction"]
    ((_, mx),) = scalars["mpwatch/grad/max_abs"]
    assert zero == np.float32(np.mean(g == 0))
    assert sub == np.float32(np.mean((g > 0) & (g < 2.0**-14)))
    assert mx == np.float32(g.max())
    assert "grad_variables" not in records


def test_subclassed_model_records_the_scale_used(tmp_path, policy, read_events):
    """A subclassed model builds its optimizer inside the first traced step: the record still
    carries the scale the gradients were scaled with."""
    import keras

    import mpwatch

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            # small fixed weights: dL/dy * 2**15 stays far below 65504, so no step is skipped
            # (a random init can overflow the first step and halve the scale)
            self.d = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(0.1))

        def call(self, x):
            return self.d(x)

    with policy("mixed_float16"):
        model = Net()
        model.compile("sgd", "mse")
        model.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32), batch_size=2,
                  verbose=0, callbacks=[mpwatch.GradientHealthMonitor(tmp_path, log_every=1)])
    _, records = read_events(tmp_path)
    assert [rec["loss_scale"] for _, rec in records["grad_variables"]] == [S, S]
