"""A probed fit on Keras' JAX backend, for tests/record/test_program_cache.py.

Run as ``KERAS_BACKEND=jax python tests/jax/program_cache_fit.py OUT_DIR`` with
``MPWATCH_CACHE_DIR`` set as the test wants (an empty folder, the same folder again, or ``off``):
the backend and JAX's devices are fixed per process, and the cache is about what a *later
process* loads. It trains a small CNN (Conv2D, BatchNormalization, two Dense layers) under
mixed_bfloat16 with ``MixedPrecisionMonitor(probe_every=2)`` (so the probe's program and float8
readiness' capture are compiled, or loaded), and writes ``OUT_DIR/truth.json``: per fit, its
logdir (the test reads the probe records from the event files), the trained weights, what the
program cache did (``program_cache.stats``) and the cache folder's entries; and whether
TensorFlow was imported.

With ``DAMAGE=1`` it trains a second fit after overwriting every cache entry with other bytes.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import mpwatch
from mpwatch.record.runtime import program_cache

assert keras.backend.backend() == "jax", keras.backend.backend()


def model_and_data():
    keras.backend.clear_session()  # each fit's model has the same names (they are in its records)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras.Sequential(
        [
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(3, dtype="float32", name="head"),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    rng = np.random.default_rng(5)  # (keras.utils.set_random_seed would import TensorFlow)
    for v in model.trainable_variables:
        v.assign(rng.uniform(-0.5, 0.5, v.shape).astype("float32"))
    x = rng.normal(size=(48, 12, 12, 3)).astype("float32")
    y = rng.normal(size=(48, 3)).astype("float32")
    return model, x, y


def one_fit(logdir):
    before = dict(program_cache.stats)
    model, x, y = model_and_data()
    monitor = mpwatch.MixedPrecisionMonitor(logdir, probe_every=2, budget=None)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[monitor])
    did = {k: program_cache.stats[k] - before[k] for k in ("hits", "misses", "errors")}
    return {
        "logdir": logdir,
        # the probe's program loaded beside training (on a CPU only from the cache)
        "ahead": any(getattr(p, "_ahead", False) for p in monitor.parts),
        "weights": [np.asarray(w).tolist() for w in model.get_weights()],
        "cache": did,
        "entries": entries(),
    }


def entries():
    where = program_cache.folder()
    if where is None or not os.path.isdir(where):
        return {}
    return {e.name: e.stat().st_size for e in os.scandir(where) if e.name.endswith(".xla")}


def main(out):
    truth = {"fits": [one_fit(os.path.join(out, "fit0"))]}
    if os.environ.get("DAMAGE") == "1":
        where = program_cache.folder()
        for name in entries():
            with open(os.path.join(where, name), "wb") as f:
                f.write(b"not an executable" * 100)
        truth["damaged"] = sorted(entries())
        truth["fits"].append(one_fit(os.path.join(out, "fit1")))
    truth["tensorflow_imported"] = "tensorflow" in sys.modules
    truth["folder"] = program_cache.folder()
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
