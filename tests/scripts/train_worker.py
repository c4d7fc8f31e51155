"""A training process for the resilience tests (run as a subprocess, never imported by pytest).

    python train_worker.py LOGDIR [--kill-at STEP] [--backup DIR] [--multiworker]

Trains a tiny mixed_float16 model with MixedPrecisionMonitor on fixed data in which the batches
listed in OVERFLOW_BATCHES hold a huge input, so their float16 gradients overflow and the update is
skipped. With --multiworker, TF_CONFIG describes the cluster and the model trains under
MultiWorkerMirroredStrategy; note that Keras 3.15's ``fit`` itself fails under that strategy
(keras-team/keras#20585: ``_maybe_symbolic_build`` reduces a PerReplica batch), with or without
mpwatch, so no test uses this path yet. With --kill-at, the process
sends itself SIGKILL after that many batches of this process (a real kill: no cleanup runs). With
--backup, Keras' BackupAndRestore saves every 4 batches and restores on start.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

import numpy as np  # noqa: E402

BATCH = 8
BATCHES_PER_EPOCH = 12
EPOCHS = 2
OVERFLOW_BATCHES = (3, 7)  # batch indices within each epoch whose gradients overflow in float16


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * BATCHES_PER_EPOCH, 6)).astype("float32")
    y = rng.normal(size=(BATCH * BATCHES_PER_EPOCH, 1)).astype("float32")
    for b in OVERFLOW_BATCHES:
        x[b * BATCH, 0] = 3.0e4  # activations and gradients far past 65504 once scaled
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir")
    ap.add_argument("--kill-at", type=int, default=None)
    ap.add_argument("--backup", default=None)
    ap.add_argument("--multiworker", action="store_true")
    ap.add_argument("--truth", default=None, help="write per-step dynamic_scale here (json)")
    ap.add_argument("--no-monitor", action="store_true", help="plain Keras (for comparison)")
    args = ap.parse_args()

    import keras
    import tensorflow as tf

    import mpwatch

    keras.config.disable_traceback_filtering()
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(1)
    if args.multiworker:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()

    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(options)

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")

    scales: list[float] = []

    class Truth(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001
            scales.append(float(self.model.optimizer.dynamic_scale.numpy()))

    class Kill(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001
            Kill.seen += 1
            if args.kill_at is not None and Kill.seen >= args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    callbacks = [Truth(), Kill()]
    if not args.no_monitor:
        callbacks.insert(0, mpwatch.MixedPrecisionMonitor(log_dir=args.logdir, log_every=4))
    if args.backup:
        callbacks.insert(0, keras.callbacks.BackupAndRestore(args.backup, save_freq=4))
    model.fit(ds, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump(
                {"scales": scales, "iterations": int(model.optimizer.iterations.numpy())}, f
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
