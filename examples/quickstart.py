"""mpwatch quick start: train a small CNN under mixed_float16 with the monitor, then look at the
logs.

The model is the CNN of the mixed-precision tutorials (Conv2D 32, MaxPool, Conv2D 64, Flatten,
Dense 128, Dense 10 softmax) on synthetic MNIST-shaped data made here (no download). It makes the
mistake users make: the softmax output is NOT given ``dtype="float32"``, so under ``mixed_float16``
it computes and returns float16 probabilities. mpwatch's layer table shows it (``is_output`` with
``output_dtype`` float16).

    python examples/quickstart.py [--logdir logs/quickstart] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os

# TensorFlow's C++ logging up to errors quieted, as keras.io's examples do: on a machine without
# a GPU it logs "failed call to cuInit: ... UNKNOWN ERROR (303)" as an error, which a newcomer
# reads as a failure (the lines it prints before its logging starts cannot be quieted this way)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def synthetic_mnist(n: int, seed: int = 0):  # noqa: ANN201
    """MNIST-shaped images (28x28x1, float32 in [0, 1]) whose class is a learnable pattern."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=n)
    x = rng.random((n, 28, 28, 1), dtype=np.float32) * 0.3
    for k in range(10):  # class k: a bright bar at row band k
        rows = slice(2 + 2 * k, 4 + 2 * k)
        x[y == k, rows, 4:24, 0] += 0.7
    return x.clip(0, 1), y


def build_model():  # noqa: ANN201
    import keras

    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            # The usual mistake: under mixed_float16 the output layer should be
            # Dense(10, activation="softmax", dtype="float32"). Left out on purpose.
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="quickstart_cnn",
    )


def train(
    logdir: str, epochs: int = 2, samples: int = 1024, batch_size: int = 64, log_every: int = 10
) -> str:
    """Train the CNN with the monitor into ``logdir``; returns the logdir."""
    import keras

    import mpwatch

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        x, y = synthetic_mnist(samples)
        model = build_model()
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=epochs,
            verbose=2,
            # a demo of seconds: its probe and profile would not fit mpwatch's cost budget (5%
            # of the fit), so ask for them explicitly (an explicit setting wins over the budget)
            callbacks=[
                mpwatch.MixedPrecisionMonitor(
                    log_dir=logdir, log_every=log_every, probe_every=500, profile=True
                )
            ],
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return logdir


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default=os.path.join("logs", "quickstart"))
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    logdir = train(args.logdir, epochs=args.epochs)
    print(f"\nmpwatch logs are in {os.path.abspath(logdir)}")
    print(f"Open them in TensorBoard:  tensorboard --logdir {logdir}")
    # --- the diagnosis of the run (mpwatch diagnose LOGDIR prints the same) ---
    import mpwatch
    from mpwatch.show.report import render

    run = mpwatch.load_run(logdir)
    print()
    print(render(run, mpwatch.diagnose(run), "text", logdir=logdir), end="")
    return logdir


if __name__ == "__main__":
    main()
