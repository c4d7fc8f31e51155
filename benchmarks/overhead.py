"""Overhead of mpwatch's MixedPrecisionMonitor (default settings) on the quick start CNN.

Trains the same model (examples/quickstart.py: seed 001's CNN under mixed_float16) with no callback,
with ``mpwatch.MixedPrecisionMonitor`` at default settings, and with Keras'
``TensorBoard(histogram_freq=1, update_freq="batch")`` for comparison, interleaved in one process
over several repetitions. A step's time is the wall time between consecutive ``on_train_batch_end``
calls (so it includes every callback's work); the first steps of each fit (tracing) are left out.
Prints the median step-time ratio to the plain run (goal for mpwatch: <= 1.02) and the ratio of
whole-fit wall time (which includes mpwatch's retrace at each fit and TensorBoard's epoch-end
histograms).

    python benchmarks/overhead.py [--reps 5] [--steps 40] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 5  # steps left out at the start of each fit


def load_quickstart():
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples" / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="batches per fit")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)

    import keras

    import mpwatch
    from mpwatch.record.callbacks.step_time import gpu_device

    qs = load_quickstart()
    keras.mixed_precision.set_global_policy("mixed_float16")
    x, y = qs.synthetic_mnist(args.steps * args.batch_size)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self._last = [], None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self._last is not None:
                self.times.append(now - self._last)
            self._last = now

    tmp = tempfile.mkdtemp(prefix="mpwatch_bench_")
    configs = {
        "plain": lambda r: [],
        "mpwatch": lambda r: [mpwatch.MixedPrecisionMonitor(log_dir=f"{tmp}/mpwatch{r}")],
        "tensorboard": lambda r: [
            keras.callbacks.TensorBoard(
                log_dir=f"{tmp}/tb{r}", histogram_freq=1, update_freq="batch"
            )
        ],
    }
    step = {k: [] for k in configs}
    wall = {k: [] for k in configs}
    keras.utils.set_random_seed(0)
    models = {}
    for name in configs:  # one model per config, built and traced once before timing
        model = qs.build_model()
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        model.fit(
            x[: 2 * args.batch_size],
            y[: 2 * args.batch_size],
            batch_size=args.batch_size,
            verbose=0,
        )
        models[name] = model
    for rep in range(args.reps):
        order = list(configs) if rep % 2 == 0 else list(reversed(configs))
        for name in order:
            timer = Timer()
            t0 = time.perf_counter()
            models[name].fit(
                x,
                y,
                batch_size=args.batch_size,
                epochs=1,
                verbose=0,
                callbacks=[timer, *configs[name](rep)],
            )
            wall[name].append((time.perf_counter() - t0) / args.steps)
            step[name].extend(timer.times[WARMUP:])
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    med = {k: statistics.median(v) for k, v in step.items()}
    wmed = {k: statistics.median(v) for k, v in wall.items()}
    print(
        f"model: quick start CNN, mixed_float16, batch {args.batch_size}, {args.steps} steps/fit, "
        f"{args.reps} interleaved repetitions, device: {gpu_device() or 'CPU'}"
    )
    print(
        f"median step time  plain {1000 * med['plain']:.2f} ms"
        f"  mpwatch {1000 * med['mpwatch']:.2f} ms"
        f"  tensorboard {1000 * med['tensorboard']:.2f} ms"
    )
    print(
        f"mpwatch MixedPrecisionMonitor (defaults): median step-time ratio "
        f"{med['mpwatch'] / med['plain']:.3f} (goal <= 1.02); whole-fit ratio "
        f"{wmed['mpwatch'] / wmed['plain']:.3f}"
    )
    print(
        f"keras TensorBoard(histogram_freq=1, update_freq='batch'): median step-time ratio "
        f"{med['tensorboard'] / med['plain']:.3f}; whole-fit ratio "
        f"{wmed['tensorboard'] / wmed['plain']:.3f}"
    )
    return med


if __name__ == "__main__":
    main()
