"""mpwatch's host time per training step, by part: what a model whose steps are short feels.

On an accelerator a small model's step is bound by the host (keras.io's small Transformer on an
H200: 1.2-1.8 ms a step, the GPU busy 0.26 ms of it), so every microsecond of Python that mpwatch
runs per batch is a microsecond of every step. This measures it on any machine: a model whose
step is short (``--model tiny``: Dense 16 -> 4 on 16 features, batch 8; or ``transformer``,
``mobilenetv2``... of ``benchmarks/real_models.py``), trained in one process:

1. ``plain``: no callback (on JAX Keras then dispatches its batch hooks asynchronously);
2. ``plain+hook``: a callback with an empty ``on_train_batch_end`` (Keras then turns the step's
   logs into Python numbers after every batch, a device sync: what ``verbose=1`` or any Keras
   callback with a batch hook already costs);
3. ``mpwatch``: ``MixedPrecisionMonitor(log_dir)`` at its defaults (``--monitor-args`` adds
   keyword arguments; ``--async-batch-end on|off`` sets where Keras runs its batch ends, by
   default a worker thread on JAX with a GPU). Each row says where its batch ends ran.

Each configuration has its own model, traced by a first fit; then ``--reps`` interleaved fits of
``--steps`` steps each (a new monitor per fit, as a user's new ``fit`` call would have). Prints
ms/step (the fastest rep), the ratio to ``plain+hook`` and to ``plain``, and mpwatch's own time
from its ledger (the budget's ``spent``: each part's batch hooks, the shared batch-end write
``writes``, the one-time work at the fit's start and end), in microseconds per step.

    python benchmarks/host_cost.py [--backends tensorflow,jax] [--model tiny] [--steps 3000]
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the backend is fixed when Keras is imported: choose it first
    for i, arg in enumerate(sys.argv):
        if arg == "--backends" and i + 1 < len(sys.argv) and "," not in sys.argv[i + 1]:
            os.environ["KERAS_BACKEND"] = sys.argv[i + 1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def real_models() -> Any:
    """benchmarks/real_models.py (its model builders and data), loaded by whole_fit.py."""
    return _whole_fit().real_models()


def tiny_model() -> Any:
    import keras

    inp = keras.Input((16,))
    x = keras.layers.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(4, dtype="float32")(x))
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


def data_and_builder(args: argparse.Namespace) -> tuple[Any, Any]:
    """(an endless batch generator factory, a model builder)."""
    import numpy as np

    if args.model == "tiny":
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64 * args.batch_size, 16)).astype("float32")
        y = rng.normal(size=(64 * args.batch_size, 4)).astype("float32")

        def batches():
            i = 0
            while True:
                yield x[i : i + args.batch_size], y[i : i + args.batch_size]
                i = (i + args.batch_size) % len(x)

        return batches, tiny_model
    rm = real_models()
    x, y = rm.make_data(args.model, args.batch_size)
    return (lambda: rm.batches(x, y, args.batch_size)), (lambda: rm.build(args.model, args))


def run(args: argparse.Namespace) -> None:
    import keras

    import mpwatch

    keras.mixed_precision.set_global_policy(args.policy)
    batches, builder = data_and_builder(args)

    class Hook(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    root = tempfile.mkdtemp(prefix="mpwatch_host_cost_")

    def monitor(d: str) -> list[Any]:
        m = mpwatch.MixedPrecisionMonitor(d, **args.monitor_kwargs)
        m.async_batch_end = {"on": True, "off": False}.get(args.async_batch_end)
        return [m]

    configs = {"plain": lambda d: [], "plain+hook": lambda d: [Hook()], "mpwatch": monitor}
    models, worker = {}, {}  # worker: whether Keras runs the batch ends on its worker thread
    for name, make in configs.items():
        keras.utils.set_random_seed(0)
        model = builder()
        model.optimizer.build(model.trainable_variables)
        logdir = os.path.join(root, name)
        model.fit(batches(), steps_per_epoch=20, epochs=1, verbose=0, callbacks=make(logdir))
        models[name] = (model, make, logdir)
        worker[name] = keras.callbacks.CallbackList(make(logdir), model=model)._async_train
    walls: dict[str, list[float]] = {k: [] for k in configs}
    spent: list[dict[str, float]] = []
    for rep in range(args.reps):
        order = list(configs) if rep % 2 == 0 else list(configs)[::-1]
        for name in order:
            model, make, logdir = models[name]
            cbs = make(logdir)
            t0 = time.perf_counter()
            model.fit(batches(), steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=cbs)
            walls[name].append(time.perf_counter() - t0)
            if name == "mpwatch":
                spent.append(dict(cbs[0].budget.spent))
    best = {k: min(v) / args.steps for k, v in walls.items()}
    print(
        f"\nhost cost per step, backend {keras.backend.backend()}, {args.policy}, model "
        f"{args.model}, batch {args.batch_size}, {args.steps} steps, {args.reps} reps "
        f"(fastest), monitor {args.monitor_kwargs or 'defaults'}"
    )
    for name in configs:
        hook, plain = best[name] / best["plain+hook"], best[name] / best["plain"]
        print(
            f"  {name:11s} {1000 * best[name]:8.3f} ms/step   x{hook:.3f} of plain+hook   "
            f"x{plain:.3f} of plain   batch ends on "
            f"{'a worker thread' if worker[name] else 'the training thread'}"
        )
    last = min(spent, key=lambda s: sum(s.values()))
    own = sum(last.values()) / args.steps
    parts = ", ".join(f"{k} {1e6 * v / args.steps:.1f}" for k, v in sorted(last.items()))
    print(f"  mpwatch's own time (ledger): {1e6 * own:.1f} us/step; by part, us/step: {parts}")


def _whole_fit() -> Any:
    """benchmarks/whole_fit.py (its argument parser and per-backend dispatch)."""
    spec = importlib.util.spec_from_file_location("mpwatch_bench_whole", f"{HERE}/whole_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_kwargs(text: str) -> dict[str, Any]:
    """``"probe=False,log_every=10"`` as keyword arguments (``whole_fit.py``'s parser)."""
    return _whole_fit().parse_kwargs(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=None, help="tensorflow,jax: one process each")
    ap.add_argument("--model", default="tiny", help="tiny, or a model of real_models.py")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--policy", default="mixed_float16")
    ap.add_argument("--monitor-args", default="", help='e.g. "probe=False"')
    ap.add_argument("--huge-layers", type=int, default=1000)  # real_models.build reads it
    ap.add_argument(
        "--async-batch-end", choices=("auto", "on", "off"), default="auto",
        help="the monitor's async_batch_end: auto (on JAX with a GPU), on, off",
    )  # fmt: skip
    args = ap.parse_args(argv)
    args.monitor_kwargs = parse_kwargs(args.monitor_args)
    code = _whole_fit().per_backend(args.backends, argv, __file__)
    if code is not None:
        return code
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
