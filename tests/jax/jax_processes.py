"""One of two JAX processes training together (``keras.distribution.initialize``: a local
coordinator, CPU collectives over gloo, 2 host devices each, ``DataParallel`` over all 4), for
tests/record/test_jax_distribution.py.

Run as ``KERAS_BACKEND=jax python tests/jax/jax_processes.py ID PORT LOG_DIR OUT_JSON [BUDGET
[PHASE CKPT]]``, twice (process 0 and 1) with the same port and log_dir (``BUDGET``: the
monitor's cost budget, which then schedules the probe, ``-`` for none: the probe runs every 8
steps; ``PHASE``: see :func:`main`). Each process feeds its half of every batch
(``auto_shard_dataset = False``) and writes, to OUT_JSON, its process index and the weights after
the fit (the two must agree: one model)."""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from jax_distribution import build_model, data  # noqa: E402  (the same model and data)

import mpwatch  # noqa: E402


class Checkpoint(keras.callbacks.Callback):
    """After batch ``at`` (0-based): every variable of the model and its optimizer, gathered
    from both processes, saved by process 0 to ``path`` (npz): the user's own checkpoint."""

    def __init__(self, path: str, at: int) -> None:
        super().__init__()
        self.path, self.at = path, at

    def on_train_batch_end(self, batch, logs=None):
        if batch != self.at:
            return
        from jax.experimental import multihost_utils

        self.model.jax_state_sync()
        values = [
            np.asarray(multihost_utils.process_allgather(v.value, tiled=True))
            for v in self.model.variables + self.model.optimizer.variables
        ]
        if jax.process_index() == 0:
            np.savez(self.path, *values)


def main(pid: int, port: str, log_dir: str, out: str, budget: float | None = None,
         phase: str = "whole", ckpt: str = "") -> None:  # fmt: skip
    """``phase``: ``whole`` (24 batches), ``first`` (12 batches, a checkpoint after the 8th:
    then the processes end, as if killed with 4 batches logged past it), ``rest`` (the
    checkpoint restored, the 16 batches after it, with the same log_dir)."""
    keras.distribution.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    dist.auto_shard_dataset = False
    keras.distribution.set_distribution(dist)
    model = build_model()
    x, y = data()
    half = slice(pid * 4, (pid + 1) * 4)  # this process' half of every batch of 8
    xl = x.reshape(24, 8, 16)[:, half].reshape(-1, 16)
    yl = y.reshape(24, 8, 1)[:, half].reshape(-1, 1)
    callbacks: list = []
    if phase == "first":
        xl, yl = xl[: 12 * 4], yl[: 12 * 4]
        callbacks.append(Checkpoint(ckpt, at=7))
    elif phase == "rest":
        xl, yl = xl[8 * 4 :], yl[8 * 4 :]
        model.optimizer.build(model.trainable_variables)
        saved = np.load(ckpt)
        for i, v in enumerate(model.variables + model.optimizer.variables):
            v.assign(saved[f"arr_{i}"])
    monitor = mpwatch.MixedPrecisionMonitor(
        log_dir, log_every=1, probe_every=8 if budget is None else None, profile=False,
        budget=budget,
    )  # fmt: skip
    model.fit(xl, yl, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[monitor, *callbacks])  # fmt: skip
    weights = [np.asarray(w.value.addressable_shards[0].data).tolist() for w in model.weights]
    with open(out, "w") as f:
        json.dump({"process": jax.process_index(), "weights": weights}, f)


if __name__ == "__main__":
    arg = sys.argv[5] if len(sys.argv) > 5 else "-"
    budget = None if arg == "-" else float(arg)
    rest = sys.argv[6:8] if len(sys.argv) > 7 else ["whole", ""]
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], budget, *rest)
