"""Fits whose probe cannot run, printed as a user sees them (run as a subprocess, never imported by
pytest; tests/record/test_cannot_run.py reads what it prints and writes).

    python cannot_run.py OUT

Two cases under ``mixed_float16``, each a plain fit and the same fit with
``MixedPrecisionMonitor(probe_every=1)`` from the same seed:

- ``distiller``: keras.io's knowledge-distillation ``Distiller`` (a ``keras.Model`` whose
  ``train_step`` runs a teacher and a student), compiled with its own arguments and no ``loss``;
- ``mirrored``: a Sequential model under ``tf.distribute.MirroredStrategy`` over two logical CPU
  devices (set before TensorFlow starts), no ``probe_data``.

Logging is as a user's: nothing configured, so Python's last-resort handler prints the
``"mpwatch"`` logger's warnings and errors to stderr. To see the DEBUG records too, that very
handler object is put on the logger with a recording handler beside it, and the logger's level
lowered to DEBUG: stderr shows what it shows without them. Between ``=== <case>`` and ``=== end``
on stderr is what the monitored fit printed. OUT/truth.json: per case, whether the weights and
History equal the plain fit's, and the DEBUG records (level, message, traceback text).
"""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import mpwatch  # noqa: E402


class Distiller(keras.Model):
    """keras.io's knowledge distillation (its TensorFlow train_step), on Keras 3."""

    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(
        self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3
    ):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def train_step(self, data):
        x, y = data
        teacher_predictions = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            student_predictions = self.student(x, training=True)
            student_loss = self.student_loss_fn(y, student_predictions)
            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_predictions / self.temperature, axis=1),
                ops.softmax(student_predictions / self.temperature, axis=1),
            )
            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
            scaled = self.optimizer.scale_loss(loss)
        variables = self.student.trainable_variables
        gradients = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(gradients, variables))
        results = self.compute_metrics(x, y, student_predictions)
        results["student_loss"] = student_loss
        return results

    def call(self, x):
        return self.student(x)


rng = np.random.default_rng(0)
X = rng.random((24, 6), dtype=np.float32)
Y = rng.integers(0, 3, 24)


def tiny(width: int = 3) -> keras.Model:
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(width)]
    )


def distiller(callbacks):
    keras.utils.set_random_seed(1)
    model = Distiller(student=tiny(), teacher=tiny())
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )
    history = model.fit(X, Y, batch_size=6, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    return model, history


def mirrored(callbacks):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = tiny()
        model.compile(keras.optimizers.SGD(0.01), "mse")
    y = np.eye(3, dtype=np.float32)[Y]
    history = model.fit(X, y, batch_size=6, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    return model, history


class Keep(logging.Handler):
    """Every record of the "mpwatch" logger: level, message, traceback text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        tb = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        self.records.append({"level": record.levelname, "message": record.getMessage(), "tb": tb})


def main(out: str) -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    logger = logging.getLogger("mpwatch")
    truth = {}
    for name, fit in (("distiller", distiller), ("mirrored", mirrored)):
        plain, plain_history = fit([])
        keep = Keep()
        logger.addHandler(logging.lastResort)  # what stderr shows with no logging configured
        logger.addHandler(keep)
        logger.setLevel(logging.DEBUG)
        print(f"=== {name}", file=sys.stderr, flush=True)
        monitored, history = fit(
            [mpwatch.MixedPrecisionMonitor(os.path.join(out, name), probe_every=1)]
        )
        sys.stderr.flush()
        print("=== end", file=sys.stderr, flush=True)
        logger.removeHandler(keep)
        logger.removeHandler(logging.lastResort)
        logger.setLevel(logging.NOTSET)
        truth[name] = {
            "same_weights": all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(plain.get_weights(), monitored.get_weights(), strict=True)
            ),
            "same_history": plain_history.history == history.history,
            "epochs": len(history.history.get("loss") or history.history.get("student_loss")),
            "records": keep.records,
        }
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
