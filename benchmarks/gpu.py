"""Seed 004's table from mpwatch's own records: float32 vs mixed precision on this accelerator.

Trains seed 004's convnet (256x256x3 input, Conv2D 32/64/128 with BatchNormalization, global
average pooling, Dense 10, float32 softmax; Adam) under ``float32``, ``mixed_float16`` and
``mixed_bfloat16`` at each batch size, each run in its own process (so each run's peak device
memory is its own: JAX keeps one peak per process) with ``mpwatch.MixedPrecisionMonitor`` at its
defaults (``log_every=20`` for several intervals) writing ``LOGDIR/<policy>_bs<batch>``. Synthetic
data: one batch placed on the device once and fed every step, as the H100 anchor was measured.

Then prints, **from the records** (``mpwatch.load_run``): ms/step (the median of the recorded
interval medians after the first interval), peak memory, and the speed-up and memory ratios of
each mixed policy against float32 at the same batch size; mpwatch's overhead at one batch size
(the same model trained with and without the monitor, interleaved in one process, ``--reps``
times: steady-state time per step between two synchronised points, so asynchronous dispatch and
any stall mpwatch causes are both counted); and the ``mixed-vs-float32`` findings of
``mpwatch diagnose`` on the logdir.

    python benchmarks/gpu.py [--batch-sizes 32,128,512] [--steps 200] [--reps 3] [--logdir DIR]

On a machine without an accelerator the defaults shrink (64x64 input, batch 16, 12 steps, 2 reps:
float16 is emulated on a CPU, and the table then shows mixed precision *slower*, which the
diagnosis says). Works on Keras' TensorFlow and JAX backends (``KERAS_BACKEND``). The anchor for an
H100 at batch 128 (``../shared/data/h100/README.md``): float32 12.4 ms/step, mixed_float16 5.5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
LOG_EVERY = 20
WARMUP = 5  # steps of each fit left out of the overhead timing (tracing, compilation)


def has_accelerator() -> bool:
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def build_model(size: int):
    """Seed 004's convnet (its R code, in Keras 3)."""
    import keras

    return keras.Sequential(
        [
            keras.Input((size, size, 3)),
            keras.layers.Conv2D(32, 5, strides=2, padding="same", activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Conv2D(64, 7, strides=2, padding="same", activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Conv2D(128, 11, strides=2, padding="same", activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


def device_batch(batch: int, size: int):
    """One synthetic batch, on the accelerator where the backend lets us put it there."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (batch, size, size, 3)).astype("float32")
    y = rng.integers(0, 10, batch).astype("int32")
    if keras.backend.backend() == "jax":
        import jax

        return jax.device_put(x), jax.device_put(y)
    return x, y


def batches(x, y):
    while True:
        yield x, y


def compiled(policy: str, size: int):
    import keras

    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(4)
    model = build_model(size)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    return model


# --- one run per process --------------------------------------------------------------------------
def one_run(policy: str, batch: int, size: int, steps: int, logdir: str) -> None:
    import mpwatch

    model = compiled(policy, size)
    x, y = device_batch(batch, size)
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=LOG_EVERY)
    model.fit(batches(x, y), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[monitor])


def from_records(logdir: str) -> dict:
    """ms/step and peak memory of one run, read back from its records."""
    import mpwatch
    from mpwatch import contract

    run = mpwatch.load_run(logdir)
    times = list(run.scalar(contract.STEP_TIME_MS))
    steady = times[1:] or times  # the first interval holds compilation's tail
    mem = list(run.scalar(contract.PEAK_MEMORY_MB))
    device = (run.info or {}).get("device") or {}
    return {
        "ms": statistics.median(steady) if steady else float("nan"),
        "peak_mb": max(mem) if mem else float("nan"),
        "device": " ".join(str(device[k]) for k in ("type", "name") if device.get(k)) or "?",
    }


# --- overhead: with and without the monitor, interleaved in one process ---------------------------
def overhead(policy: str, batch: int, size: int, steps: int, reps: int, logdir: str) -> dict:
    import keras
    import numpy as np

    import mpwatch

    class Clock(keras.callbacks.Callback):
        """Wall time from the end of step WARMUP to the end of the last step, each end waited
        for (the step's loss read on the host): steady-state time per step, async included."""

        def __init__(self):
            super().__init__()
            self.t0 = self.t1 = None

        def on_train_batch_end(self, batch_index, logs=None):
            if batch_index in (WARMUP - 1, steps - 1):
                np.asarray((logs or {}).get("loss", 0.0))
                now = time.perf_counter()
                if batch_index == WARMUP - 1:
                    self.t0 = now
                else:
                    self.t1 = now

    x, y = device_batch(batch, size)
    models = {name: compiled(policy, size) for name in ("plain", "mpwatch")}
    per_step: dict[str, list[float]] = {name: [] for name in models}
    for rep in range(reps):
        order = list(models) if rep % 2 == 0 else list(reversed(models))
        for name in order:
            clock = Clock()
            cbs = [clock]
            if name == "mpwatch":
                cbs.insert(0, mpwatch.MixedPrecisionMonitor(f"{logdir}/rep{rep}", log_every=20))
            models[name].fit(
                batches(x, y), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=cbs
            )
            per_step[name].append((clock.t1 - clock.t0) / (steps - WARMUP))
    ratios = [m / p for m, p in zip(per_step["mpwatch"], per_step["plain"])]
    return {
        "plain_ms": 1000 * statistics.median(per_step["plain"]),
        "mpwatch_ms": 1000 * statistics.median(per_step["mpwatch"]),
        "ratios": ratios,
    }


# --- the driver -----------------------------------------------------------------------------------
def child(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child {args} failed:\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :]) if lines else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default=None, help="comma-separated")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="steps per run")
    parser.add_argument("--reps", type=int, default=None, help="overhead repetitions")
    parser.add_argument("--overhead-batch", type=int, default=None)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--logdir", default=None)
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        kind, policy, batch, size, steps, logdir, *rest = args.child
        if kind == "run":
            one_run(policy, int(batch), int(size), int(steps), logdir)
            print("RESULT " + json.dumps(from_records(logdir)))
        else:
            out = overhead(policy, int(batch), int(size), int(steps), int(rest[0]), logdir)
            print("RESULT " + json.dumps(out))
        return

    gpu = has_accelerator()
    batch_sizes = [int(b) for b in (args.batch_sizes or ("32,128,512" if gpu else "16")).split(",")]
    size = args.image_size or (256 if gpu else 64)
    steps = args.steps or (200 if gpu else 2 * LOG_EVERY + 1)
    reps = args.reps or (3 if gpu else 2)
    ob = args.overhead_batch or (128 if 128 in batch_sizes else batch_sizes[0])
    policies = args.policies.split(",")
    logdir = args.logdir or tempfile.mkdtemp(prefix="mpwatch_gpu_")
    import keras

    rows = {}
    for bs in batch_sizes:
        for policy in policies:
            d = os.path.join(logdir, f"{policy}_bs{bs}")
            rows[(policy, bs)] = child(
                ["--child", "run", policy, str(bs), str(size), str(steps), d]
            )
            print(f"  {policy} batch {bs}: done", file=sys.stderr, flush=True)
    device = next(iter(rows.values()))["device"]
    print(
        f"seed 004 convnet {size}x{size}x3, {steps} steps a run, Keras {keras.__version__} on "
        f"{keras.backend.backend()}, device: {device}; figures from mpwatch's records "
        f"({logdir})"
    )
    print(
        f"{'batch':>5}  {'policy':<15}{'ms/step':>9}{'peak MiB':>10}{'speed-up':>10}{'memory':>8}"
    )
    for bs in batch_sizes:
        base = rows.get(("float32", bs))
        for policy in policies:
            r = rows[(policy, bs)]
            speed = f"{base['ms'] / r['ms']:.2f}x" if base and policy != "float32" else ""
            mem = f"{r['peak_mb'] / base['peak_mb']:.2f}" if base and policy != "float32" else ""
            print(f"{bs:>5}  {policy:<15}{r['ms']:>9.2f}{r['peak_mb']:>10.0f}{speed:>10}{mem:>8}")

    od = os.path.join(tempfile.mkdtemp(prefix="mpwatch_gpu_overhead_"), "o")
    o = child(
        ["--child", "overhead", "mixed_float16", str(ob), str(size), str(steps), od, str(reps)]
    )
    r = o["ratios"]
    print(
        f"mpwatch overhead (mixed_float16, batch {ob}, {reps} interleaved repetitions of "
        f"{steps - WARMUP} steady steps): plain {o['plain_ms']:.2f} ms/step, monitored "
        f"{o['mpwatch_ms']:.2f} ms/step, ratio median {statistics.median(r):.3f} "
        f"(min {min(r):.3f}, max {max(r):.3f})"
    )

    import mpwatch

    findings = [f for f in mpwatch.diagnose(logdir) if f.rule == "mixed-vs-float32"]
    print(f"mpwatch diagnose {logdir}: {len(findings)} mixed-vs-float32 finding(s)")
    for f in findings:
        print(f"  [{f.run}] {f.severity.upper():<8}{f.title}")
        for line in f.evidence.splitlines():
            print(f"          {line}")


if __name__ == "__main__":
    main()
