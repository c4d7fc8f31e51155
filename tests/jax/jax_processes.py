"""One of two JAX processes training together (``keras.distribution.initialize``: a local
coordinator, CPU collectives over gloo, 2 host devices each, ``DataParallel`` over all 4), for
tests/record/test_jax_distribution.py.

Run as ``KERAS_BACKEND=jax python tests/jax/jax_processes.py ID PORT LOG_DIR OUT_JSON [BUDGET]``,
twice (process 0 and 1) with the same port and log_dir (``BUDGET``, a 6th argument: the
monitor's cost budget, which then schedules the probe; without it the probe runs every 8
steps). Each process feeds its half of every batch (``auto_shard_dataset = False``) and writes,
to OUT_JSON, its process index and the weights after the fit (the two must agree: one model)."""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mpwatch  # noqa: E402

OVERFLOW_BATCHES = {2, 3, 9, 17}


def main(pid: int, port: str, log_dir: str, out: str, budget: float | None = None) -> None:
    keras.distribution.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    dist.auto_shard_dataset = False
    keras.distribution.set_distribution(dist)
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu", name="d1")(inp)
    o = keras.layers.Dense(1, dtype="float32", name="out")(h)
    model = keras.Model(inp, o)
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24 * 8, 16)).astype("float32")
    for b in OVERFLOW_BATCHES:
        x[b * 8 : (b + 1) * 8] *= 1e4
    y = rng.normal(size=(24 * 8, 1)).astype("float32")
    half = slice(pid * 4, (pid + 1) * 4)  # this process' half of every batch of 8
    xl = x.reshape(24, 8, 16)[:, half].reshape(-1, 16)
    yl = y.reshape(24, 8, 1)[:, half].reshape(-1, 1)
    monitor = mpwatch.MixedPrecisionMonitor(
        log_dir, log_every=1, probe_every=8 if budget is None else None, profile=False,
        budget=budget,
    )  # fmt: skip
    model.fit(xl, yl, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    weights = [np.asarray(w.value.addressable_shards[0].data).tolist() for w in model.weights]
    with open(out, "w") as f:
        json.dump({"process": jax.process_index(), "weights": weights}, f)


if __name__ == "__main__":
    budget = float(sys.argv[5]) if len(sys.argv) > 5 else None
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], budget)
