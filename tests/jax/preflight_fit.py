"""The pre-flight on Keras' JAX backend, and the fit it predicts (run by
tests/preflight/test_preflight_jax.py in a subprocess with ``KERAS_BACKEND=jax``).

Usage: ``python preflight_fit.py OUT_JSON LOGDIR``. Writes the pre-flight's predictions and
verdicts, the truth of a 16-step fit of the same network built under mixed_float16 (the
optimizer's own iterations and scale, after ``jax_state_sync``), the applied recommendation's fit,
and whether the pre-flight imported TensorFlow.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mpwatch  # noqa: E402

STEPS = 16


def build(policy):
    keras.mixed_precision.set_global_policy(policy)  # (no keras.utils.set_random_seed: it
    # imports TensorFlow where installed; the weights are numpy's below)
    try:
        m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])  # fmt: skip
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rng = np.random.default_rng(1)  # weights of numpy's: a softmax far from saturation
    m.set_weights([rng.normal(size=(32, 64)) * 0.001, np.zeros(64),
                   rng.normal(size=(64, 10)) * 0.05, np.zeros(10)])  # fmt: skip
    m.compile(keras.optimizers.SGD(1e-4), "sparse_categorical_crossentropy")
    return m


class Iterations(keras.callbacks.Callback):
    """The optimizer's own iterations after every batch (its state synced from Keras' JAX
    trainer first)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.model.jax_state_sync()
        self.seen.append(int(np.asarray(self.model.optimizer.iterations.value)))


def fit(model, x, y):
    idx = np.arange(STEPS * len(x)) % len(x)
    its = Iterations()
    h = model.fit(x[idx], y[idx], batch_size=len(x), epochs=1, shuffle=False, verbose=0,
                  callbacks=[its])  # fmt: skip
    opt = model.optimizer
    scale = getattr(opt, "dynamic_scale", None)
    return {
        "iterations": its.seen,
        "first_skips": next((i for i, n in enumerate(its.seen) if n > 0), len(its.seen)),
        "scale": float(np.asarray(scale.value)) if scale is not None else None,
        "loss": float(h.history["loss"][-1]),
    }


def main(out, logdir):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(32, 32)) * 300).astype("float32")
    y = rng.integers(0, 10, (32,))
    model = build("float32")
    report = mpwatch.preflight(model, (x, y), log_dir=logdir)
    tensorflow_imported = "tensorflow" in sys.modules
    mixed = build("mixed_float16")
    mixed.set_weights(model.get_weights())
    fixed = mpwatch.apply_recommendations(model, report.findings)
    result = {
        "recommended": report.recommended,
        "candidates": [
            {"policy": c.policy, "verdict": c.verdict, "predictions": c.predictions,
             "fix": c.fix.action(), "checked_problems": [f.rule for f in c.checked.problems]
             if c.checked is not None else None}
            for c in report.candidates
        ],  # fmt: skip
        "fit": fit(mixed, x, y),
        "fixed_layers": list(fixed.layers),
        "fixed_output_dtype": keras.backend.standardize_dtype(fixed.model(x[:2]).dtype),
        "fixed_fit": fit(fixed.model, x, y),
        "policies_after": sorted({ly.dtype_policy.name for ly in model.layers}),
        "tensorflow_imported": tensorflow_imported,
    }
    with open(out, "w") as f:
        json.dump(result, f, default=float)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
