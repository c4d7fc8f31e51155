"""One probe's cost in units of one training step (goal: at most 3).

Trains a small CNN under ``mixed_float16`` (``mixed_bfloat16`` with ``--policy``), measures the
median
time of a training step (``model.train_on_batch``, traced once before timing) and the median time of
one probe (:meth:`mpwatch.record.probe.probe.Probe.run` on a batch of the same size, after a first,
untimed probe that pays for building the twin and tracing), and prints the ratio.

    python benchmarks/probe_cost.py [--batch 64] [--repeats 20] [--policy mixed_float16]

Runs on a GPU when TensorFlow sees one, else on the CPU (where float16 is emulated and both sides
are slow; the ratio is what matters).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build(keras, classes: int = 10):
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(classes),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--policy", default="mixed_float16")
    args = ap.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from mpwatch.record.probe.probe import Probe

    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(0)
    model = build(keras)
    model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, 32, 32, 3)).astype(np.float32)
    y = rng.integers(0, 10, size=(args.batch,)).astype(np.int32)
    xt, yt = tf.constant(x), tf.constant(y)

    def timed(fn) -> list[float]:
        out = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return out

    def step() -> None:
        model.train_on_batch(xt, yt)

    probe = Probe(model)

    def one_probe() -> None:
        probe.run((xt, yt))

    step()
    step()
    t0 = time.perf_counter()
    one_probe()  # builds the twin and traces: paid once
    first = time.perf_counter() - t0
    steps = timed(step)
    probes = timed(one_probe)
    s, p = statistics.median(steps), statistics.median(probes)
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(f"device: {device}  policy: {args.policy}  batch: {args.batch}  repeats: {args.repeats}")
    print(f"training step (median): {s * 1e3:.2f} ms")
    print(f"probe (median):         {p * 1e3:.2f} ms")
    print(f"first probe (twin + trace, once): {first * 1e3:.0f} ms")
    print(f"probe cost: {p / s:.2f} training steps (goal <= 3)")


if __name__ == "__main__":
    main()
