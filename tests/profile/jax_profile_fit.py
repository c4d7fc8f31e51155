"""Trains a small convnet under Keras' JAX backend with mpwatch's profiler, TensorFlow unimportable.

Run as ``KERAS_BACKEND=jax python tests/profile/jax_profile_fit.py OUT_DIR`` (the backend is fixed
when keras is imported, so the TensorFlow test session runs this in its own process), for
``tests/profile/test_jax_profile.py``. Every ``import tensorflow`` raises ImportError here, as on a
GPU machine that has JAX and no TensorFlow: the trace (``jax.profiler``), its conversion (xprof)
and the record must work without it. Writes ``OUT_DIR/logs`` (the run: mixed_float16,
``MixedPrecisionMonitor`` with the profile of batches 3-5) and ``OUT_DIR/facts.json`` (the
model's layers and the monitor's profile error, if any).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys


class NoTensorFlow(importlib.abc.MetaPathFinder):
    """Any import of tensorflow fails, as where it is not installed."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201, ARG002
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError(f"tensorflow is not installed here ({name})")
        return None


sys.meta_path.insert(0, NoTensorFlow())

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mpwatch  # noqa: E402

assert keras.backend.backend() == "jax", keras.backend.backend()


def main(out: str) -> None:
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(12, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10, dtype="float32"),
        ],
        name="net",
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((8 * 32, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, 8 * 32)
    logdir = os.path.join(out, "logs")
    monitor = mpwatch.MixedPrecisionMonitor(logdir, probe=False, profile=(3, 5))
    model.fit(x, y, batch_size=32, epochs=1, callbacks=[monitor], verbose=0)
    profiler = next(p for p in monitor.parts if isinstance(p, mpwatch.ProfileMonitor))
    facts = {
        "layers": [layer.name for layer in model.layers],
        "error": profiler.error,
        "steps": (profiler.result or {}).get("steps"),
        "tensorflow_imported": "tensorflow" in sys.modules,
    }
    with open(os.path.join(out, "facts.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(sys.argv[1])
