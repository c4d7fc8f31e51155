"""Steady step cost of MixedPrecisionMonitor at its defaults: many short alternating fits, paired.

The issue-27 goal "steady epochs <= 1.03x" is a difference of a few percent, which one pair of
fits cannot see on a shared machine: ``whole_fit.py``'s per-pair steady ratios of the same model
moved by +-8% (JAX Transformer, mixed_bfloat16: 1.055 and 1.076 in two runs; 0.81..1.24 over 16
pairs here, their median 1.016). This measures it so that drift cancels:

1. two fresh models built the same way (``whole_fit.py``'s builders and data), each traced by a
   first fit of 20 steps (the monitored one with a monitor);
2. ``--alternations`` pairs of fits of ``--steps`` steps each, plain and monitored alternating
   (plain first in even pairs), a new ``MixedPrecisionMonitor(log_dir)`` for every monitored fit as
   a user's new ``fit`` has; both fits end with the same timing callback;
3. the step times after each fit's first 5 steps (its start: the monitor's one-time work and any
   probe fall there or in ``whole_fit.py``'s whole-fit ratio): per pair the ratio of the two
   fits' median step times, and their median over the pairs (the goal's figure: each pair ran
   under the same machine load) with its range (how noisy the machine was); the ratio of the
   medians pooled over all fits of each kind; and the ratio of the process' CPU time per step
   (every thread's), pooled and paired.

Each step's time includes mpwatch's work on the host (its batch hooks, and every ``log_every``
steps the read and the write: outliers that the median sets aside, counted in the whole-fit
ratio) and its in-graph tap. Goal: the pairs' median ratio <= 1.03.

    python benchmarks/steady_steps.py --models mobilenetv2,transformer --backends tensorflow,jax
    python benchmarks/steady_steps.py --models mobilenetv2 --policy mixed_bfloat16 --backends jax
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
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GOAL = 1.03
SKIP = 5  # each fit's first steps: its start, in the whole-fit ratio


def whole_fit() -> Any:
    """benchmarks/whole_fit.py (its model builders, data pipeline and argument parser)."""
    spec = importlib.util.spec_from_file_location("mpwatch_bench_whole", f"{HERE}/whole_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clocks_class() -> Any:
    import keras

    class Clocks(keras.callbacks.Callback):
        """The wall clock and the process' CPU time (every thread's: XLA's and TensorFlow's
        workers, mpwatch's) at each batch end; placed last."""

        def __init__(self) -> None:
            super().__init__()
            self.ends: list[tuple[float, float]] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.ends.append((time.perf_counter(), time.process_time()))

        def steps(self) -> list[tuple[float, float]]:
            """(wall s, CPU s) of each step after the fit's first SKIP."""
            e = self.ends
            return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(e[SKIP - 1 :], e[SKIP:])]

    return Clocks


def _Clocks() -> Any:  # noqa: N802  (a class made once Keras is imported)
    global _CLOCKS
    if _CLOCKS is None:
        _CLOCKS = _clocks_class()
    return _CLOCKS()


_CLOCKS: Any = None


def measure(name: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    """Pooled steady step times of one model, plain and monitored (see the module docstring)."""
    import keras

    import mpwatch

    wf = whole_fit()
    rm = wf.real_models()
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(args.policy)
    data = wf.make_data(name, rm, args.batch_size)
    fits = {"n": 0}

    def fit(model: Any, monitored: bool, steps: int) -> list[float]:
        fits["n"] += 1
        cbs = []
        if monitored:
            logdir = os.path.join(root, f"{name}_{fits['n']}")
            cbs.append(mpwatch.MixedPrecisionMonitor(logdir, **args.monitor_kwargs))
        timer = _Clocks()
        model.fit(
            wf.pipeline(rm, data, args),
            steps_per_epoch=steps,
            epochs=1,
            verbose=0,
            callbacks=[*cbs, timer],
            shuffle=False,
        )
        return timer.steps()

    models = {}
    for kind in ("plain", "mpwatch"):
        model = wf.build(name, rm, args)
        model.optimizer.build(model.trainable_variables)  # as whole_fit.py: no second trace
        fit(model, kind == "mpwatch", 20)
        models[kind] = model
    pooled: dict[str, list[float]] = {"plain": [], "mpwatch": []}
    cpu: dict[str, list[float]] = {"plain": [], "mpwatch": []}
    pairs, cpu_pairs = [], []
    for i in range(args.alternations):
        order = ("plain", "mpwatch") if i % 2 == 0 else ("mpwatch", "plain")
        medians, cpus = {}, {}
        for kind in order:
            steps = fit(models[kind], kind == "mpwatch", args.steps)
            pooled[kind] += [w for w, _ in steps]
            cpu[kind] += [c for _, c in steps]
            medians[kind] = statistics.median(w for w, _ in steps)
            cpus[kind] = sum(c for _, c in steps) / len(steps)
        pairs.append(medians["mpwatch"] / medians["plain"])
        cpu_pairs.append(cpus["mpwatch"] / cpus["plain"])
        print(
            f"    {name} pair {i + 1}: wall {pairs[-1]:.3f}, CPU {cpu_pairs[-1]:.3f}",
            file=sys.stderr,
            flush=True,
        )
    plain, monitored = (statistics.median(pooled[k]) for k in ("plain", "mpwatch"))
    cpu_ratio = statistics.fmean(cpu["mpwatch"]) / statistics.fmean(cpu["plain"])
    return {
        "model": name, "plain": plain, "mpwatch": monitored, "pairs": pairs, "cpu": cpu_ratio,
        "cpu_pairs": cpu_pairs,
    }  # fmt: skip


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import keras

    extra = ", ".join(f"{k}={v!r}" for k, v in args.monitor_kwargs.items()) or "defaults"
    print(
        f"\nsteady steps, MixedPrecisionMonitor ({extra}) / plain, backend "
        f"{keras.backend.backend()}, {args.policy}, batch {args.batch_size}, "
        f"{args.alternations} alternating pairs of {args.steps}-step fits"
    )
    head = ["model", "plain ms", "mpwatch ms", "pooled", "pairs median (min..max)",
            "CPU s/step (pairs median)", "goal (pairs median)"]  # fmt: skip
    rows = []
    for r in results:
        ratio, pairs, cp = r["mpwatch"] / r["plain"], r["pairs"], r["cpu_pairs"]
        paired = statistics.median(pairs)
        rows.append(
            [
                r["model"],
                f"{1000 * r['plain']:.2f}",
                f"{1000 * r['mpwatch']:.2f}",
                f"{ratio:.3f}",
                f"{paired:.3f} ({min(pairs):.3f}..{max(pairs):.3f})",
                f"{r['cpu']:.3f} ({statistics.median(cp):.3f})",
                f"<= {GOAL:.2f} {'met' if paired <= GOAL else 'MISSED'}",
            ]
        )
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenetv2,transformer", help="as whole_fit.py's")
    ap.add_argument("--backends", default=None, help="tensorflow,jax: one process each")
    ap.add_argument("--policy", default="mixed_float16")
    ap.add_argument("--steps", type=int, default=40, help="steps of each fit")
    ap.add_argument("--alternations", type=int, default=10, help="pairs of fits per model")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--monitor-args", default="", help='e.g. "log_every=10"')
    ap.add_argument("--huge-layers", type=int, default=1000)
    args = ap.parse_args(argv)
    wf = whole_fit()
    code = wf.per_backend(args.backends, argv, __file__)
    if code is not None:
        return code
    if args.steps <= SKIP + 1 or args.alternations < 1:
        ap.error(f"--steps: more than {SKIP + 1}; --alternations: at least 1")
    names = [m for m in args.models.split(",") if m]
    for n in names:
        if n not in wf.MODELS and not n.startswith(wf.APP):
            ap.error(f"--models: {n!r}: choose from {', '.join(wf.MODELS)}, or {wf.APP}NAME")
    args.monitor_kwargs = wf.parse_kwargs(args.monitor_args)
    args.keras_pipeline = False
    args.prebuild = True
    root = tempfile.mkdtemp(prefix="mpwatch_steady_")
    results, failed = [], []
    try:
        for name in names:
            try:
                results.append(measure(name, args, root))
            except Exception as e:  # noqa: BLE001  (e.g. JAX on a CPU: no float16 dot_general)
                failed.append(f"{name}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
                print(f"    {name} could not be measured: {failed[-1]}", file=sys.stderr)
            if results:
                report(results, args)  # each row as it ends: a run cut short keeps what it had
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for line in failed:
        print(f"  not measured: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
