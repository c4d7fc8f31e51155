"""A training process for the resilience tests (run as a subprocess, never imported by pytest).

    python train_worker.py LOGDIR [--kill-at N] [--backup DIR [--backup-every N]] [--multiworker]
                                  [--loop]
                                  [--truth FILE] [--no-monitor]

Trains a tiny mixed_float16 model with mpwatch on fixed data in which the batches listed in
OVERFLOW_BATCHES hold a huge input in their first row, so their float16 gradients overflow and the
update is skipped. ``model.fit`` with MixedPrecisionMonitor by default; with --loop, the same
training as a custom loop with TrainingLoopRecorder. With --multiworker, TF_CONFIG describes the
cluster and the custom loop runs under MultiWorkerMirroredStrategy (Keras 3's ``fit`` itself fails
under that strategy, with or without mpwatch: keras-team/keras#20585, ``_maybe_symbolic_build``
reduces a PerReplica batch). With --kill-at, the process sends itself SIGKILL after that many
batches of this process (a real kill: no cleanup runs). With --backup, Keras' BackupAndRestore
saves every --backup-every batches (default 4) and restores on start; it comes *after* the monitor
in the callback list, so mpwatch's on_train_begin runs before the restore. With --truth, the
optimizer's own ``dynamic_scale`` after every batch and its final ``iterations`` are written there
as JSON (and, for fit, ``iterations`` after every batch).
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
    ap.add_argument("--backup-every", type=int, default=4)
    ap.add_argument("--multiworker", action="store_true")
    ap.add_argument("--truth", default=None, help="write per-step dynamic_scale here (json)")
    ap.add_argument("--no-monitor", action="store_true", help="plain Keras (for comparison)")
    ap.add_argument("--loop", action="store_true", help="a custom training loop, not fit")
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
    if args.multiworker or args.loop:
        return custom_loop(args, model, strategy, x, y)

    iterations: list[int] = []

    class Truth(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001
            scales.append(float(self.model.optimizer.dynamic_scale.numpy()))
            iterations.append(int(self.model.optimizer.iterations.numpy()))

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
        callbacks.append(keras.callbacks.BackupAndRestore(args.backup, save_freq=args.backup_every))
    model.fit(ds, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    if args.truth:
        with open(args.truth, "w") as f:
            final = int(model.optimizer.iterations.numpy())
            json.dump(
                {"scales": scales, "iterations": final, "iterations_per_batch": iterations}, f
            )
    return 0


def custom_loop(args, model, strategy, x, y) -> int:  # noqa: ANN001
    """The same training as a custom loop under ``strategy`` (Keras' fit fails under
    MultiWorkerMirroredStrategy): each replica takes its slice of every global batch, so the
    gradients summed across replicas equal a single process's on the same batch."""
    import keras
    import tensorflow as tf

    import mpwatch

    n = strategy.num_replicas_in_sync

    def dataset_fn(ctx):  # noqa: ANN001, ANN202
        per = BATCH // n
        rows = np.concatenate(
            [np.arange(b * BATCH, (b + 1) * BATCH)[ctx.input_pipeline_id * per :][:per]
             for b in range(BATCHES_PER_EPOCH)]
        )  # fmt: skip
        return tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(per)

    with strategy.scope():
        opt = model.optimizer
        opt.build(model.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError(reduction="none")

    @tf.function
    def step(batch):  # noqa: ANN001, ANN202
        def replica(xb, yb):  # noqa: ANN001, ANN202
            with tf.GradientTape() as tape:
                per_example = loss_fn(yb, model(xb, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
                scaled = opt.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            grads = mpwatch.share_skip_decision(grads)  # else a lone overflow hangs MWMS
            opt.apply(grads, model.trainable_variables)
            return loss

        losses = strategy.run(replica, args=batch)
        return strategy.reduce("SUM", losses, axis=None)

    scales = []
    rec = None
    if not args.no_monitor:
        rec = mpwatch.TrainingLoopRecorder(
            model, args.logdir, optimizer=opt, log_every=4, probe=False, profile=False
        )
        rec.begin()
    for _ in range(EPOCHS):
        epoch_loss = keras.metrics.Mean()  # what fit reports: the epoch's running mean
        for batch in strategy.distribute_datasets_from_function(dataset_fn):
            epoch_loss.update_state(step(batch))
            if rec is not None:
                rec.step_end(loss=epoch_loss.result())
            scales.append(float(opt.dynamic_scale.numpy()))
    if rec is not None:
        rec.end()
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump({"scales": scales, "iterations": int(opt.iterations.numpy())}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
