"""Whole-fit cost of MixedPrecisionMonitor at its defaults (the cost budget on), by fit length.

For each model and each target plain fit length T (seconds: ``--seconds 10,60,300``), on the
Keras backend this process runs (``KERAS_BACKEND``; ``--backends tensorflow,jax`` runs one process
per backend):

1. a calibration fit of a fresh plain model (``--calib`` steps) gives Keras' first step (its
   trace) and the steady step time; the fit length is then ``N`` steps, so that a plain fit of
   ``N`` steps takes about T seconds (at least 8 steps);
2. ``--reps`` interleaved pairs (plain first in odd pairs, monitored first in even ones), each on
   a fresh model built the same way (build not timed): one ``fit`` of ``N`` steps, wall time from
   the call to its return, the monitored one with ``MixedPrecisionMonitor(log_dir)`` and nothing
   else (its defaults: ``budget=0.05``, no explicit probe or profile; ``--monitor-args`` adds
   keyword arguments, e.g. ``"probe_every=10"`` for the fixed costs a user who asks for probes
   pays);
   Both models have their optimizer built before the fit (``model.optimizer.build``): Keras on
   TensorFlow otherwise creates a LossScaleOptimizer's variables inside the first trace of the
   train step and traces it twice, which mpwatch's tap avoids (``--no-prebuild``: as Keras does);
3. per pair the whole-fit ratio monitored / plain, the steady step ratio (median step times over
   the steps after the first 5, from a timing callback placed last), and the budget's ledger of
   the monitored fit: mpwatch's own seconds per part and each decision (what ran, what was
   skipped or deferred, its estimate and real cost).

Goals (issue 27): whole fit <= 1.10x for plain fits of 60 s or more, <= 1.25x for 10-60 s, steady
steps <= 1.03x. The ratios are measured in one process, pair by pair; on a shared machine a single
pair moves by several percent: read the median and the range. The steady column of two pairs
cannot resolve 3% here (one pair's steady ratio moves by 8-20%): ``benchmarks/steady_steps.py``
measures that goal over many alternating pairs. A fit of fewer than ``STEADY_MIN`` steady steps
(its compile filled the target) shows none.

    python benchmarks/real_models.py --whole-fit 10,60 --models mobilenetv2,transformer
    python benchmarks/whole_fit.py --models mobilenetv2 --seconds 10,60 --backends tensorflow,jax
    python benchmarks/whole_fit.py --models mobilenetv2 --policy mixed_bfloat16 --backends jax
    python benchmarks/whole_fit.py --models app:DenseNet121,app:Xception --backends jax
    python benchmarks/whole_fit.py --models efficientnetb0 --seconds 30 \
        --monitor-args probe_every=10
    python benchmarks/whole_fit.py --backends jax --models transformer --devices 4 \
        --distribution model_parallel
    python benchmarks/whole_fit.py --backends jax --models mobilenetv2 --policy mixed_bfloat16 \
        --seconds 24 --monitor-args probe_every=10 --program-cache warm

``--program-cache cold`` (the default) gives every monitored fit an empty mpwatch cache
(``MPWATCH_CACHE_DIR``): what a first run pays, the probe's JAX programs compiled. ``warm`` runs
one untimed monitored fit first: what a later run of the same script pays, its programs loaded
(:mod:`mpwatch.record.runtime.program_cache`).

``--distribution data_parallel|model_parallel`` (JAX) trains both fits under a
``keras.distribution`` over every device (``--devices N``: N host devices, for a CPU):
``DataParallel``, or ``ModelParallel`` on a (devices/2, 2) mesh with every Dense kernel sharded
over its ``model`` axis (a ``LayoutMap`` on ``.*dense.*kernel``).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the backend is fixed when Keras is imported: choose it first
    for i, arg in enumerate(sys.argv):
        if arg == "--backends" and i + 1 < len(sys.argv) and "," not in sys.argv[i + 1]:
            os.environ["KERAS_BACKEND"] = sys.argv[i + 1]
        if arg == "--devices" and i + 1 < len(sys.argv):  # XLA reads it when JAX starts
            os.environ["XLA_FLAGS"] = (
                os.environ.get("XLA_FLAGS", "")
                + f" --xla_force_host_platform_device_count={int(sys.argv[i + 1])}"
            )
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import ast  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("resnet50", "mobilenetv2", "efficientnetb0", "transformer")
APP = "app:"  # app:NAME: any keras.applications model (weights=None, APP_SIZE px, 10 classes)
APP_SIZE = 96  # at least every application's minimum input (Xception 71, InceptionV3 75)
WARMUP = 5
MIN_STEPS = 8
#: steady steps a fit needs for its steady ratio (a fit whose first step, its compile, fills the
#: target has only ``MIN_STEPS``: MobileNetV2 on an H200 printed a "steady" 0.516 of 3 steps)
STEADY_MIN = 20


def set_distribution(kind: str) -> None:
    """``keras.distribution`` over every device for the fits that follow (JAX)."""
    import keras

    devices = keras.distribution.list_devices()
    if kind == "data_parallel":
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        return
    if len(devices) < 2 or len(devices) % 2:
        raise SystemExit("--distribution model_parallel: an even number of devices (--devices)")
    mesh = keras.distribution.DeviceMesh((len(devices) // 2, 2), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*dense.*kernel"] = (None, "model")
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")
    )
    print(f"distribution: {kind} over {len(devices)} devices", flush=True)


def real_models() -> Any:
    """benchmarks/real_models.py (its model builders, data and timing callback)."""
    spec = importlib.util.spec_from_file_location("mpwatch_bench_real", f"{HERE}/real_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(name: str, rm: Any, args: argparse.Namespace) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    if name == "efficientnetb0" or name.startswith(APP):
        size, app = (64, "EfficientNetB0") if name == "efficientnetb0" else (APP_SIZE, name[4:])
        model = getattr(keras.applications, app)(
            weights=None, input_shape=(size, size, 3), classes=10
        )
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        return model
    return rm.build(name, args)


def make_data(name: str, rm: Any, batch_size: int) -> Any:
    if name.startswith(APP):  # images of the application's size, pixels in [0, 1]
        import numpy as np

        n, rng = rm.POOL * batch_size, np.random.default_rng(0)
        x = rng.uniform(0, 1, (n, APP_SIZE, APP_SIZE, 3)).astype("float32")
        return x, rng.integers(0, 10, n)
    return rm.make_data("resnet50" if name == "efficientnetb0" else name, batch_size)


def pipeline(rm: Any, data: Any, args: argparse.Namespace) -> Any:
    """The batches, cycled. On TensorFlow a ``tf.data`` pipeline with its autotuning off and no
    prefetch: Keras wraps a generator or arrays in ``prefetch(AUTOTUNE)``, and at the fit's end
    TensorFlow's teardown of that iterator sometimes waits for tf.data's autotuning thread (measured
    on DenseNet121, 2 CPU cores: fits of 39-52 s returned 10-40 s after their last callback, in
    about 2 of 5, plain and monitored alike; never in 6 fits without autotuning): a delay of
    TensorFlow's that lands on either fit of a pair at random. ``--keras-pipeline``: Keras' own."""
    if args.keras_pipeline or _backend() != "tensorflow":
        return rm.batches(*data, args.batch_size)
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(data).batch(args.batch_size).repeat()
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def _backend() -> str:
    import keras

    return keras.backend.backend()


def fit_once(name: str, rm: Any, args, data, steps: int, monitor_kwargs=None, logdir=None):
    """One fit of ``steps`` steps on a fresh model; (wall s, step times, monitor or None)."""
    import mpwatch

    model = build(name, rm, args)
    if args.prebuild:
        # Keras on TensorFlow creates a LossScaleOptimizer's variables inside the first trace of
        # the train step, and so traces it twice (MobileNetV2: a 21 s first step, 11.5 s with the
        # optimizer built first); mpwatch's tap builds it first. Both fits build it here, so the
        # ratio is mpwatch's cost, not Keras' second trace (--no-prebuild: as Keras does)
        model.optimizer.build(model.trainable_variables)
    monitor = None
    cbs = []
    if monitor_kwargs is not None:
        monitor = mpwatch.MixedPrecisionMonitor(logdir, **monitor_kwargs)
        cbs.append(monitor)
    tail = rm.Timer()
    t0 = time.perf_counter()
    model.fit(
        pipeline(rm, data, args),
        steps_per_epoch=steps,
        epochs=1,
        verbose=0,
        callbacks=[*cbs, tail],
        shuffle=False,
    )
    wall = time.perf_counter() - t0
    ends = tail.ends
    steady = [b - a for a, b in zip(ends[WARMUP - 1 :], ends[WARMUP:])]
    del model
    gc.collect()
    return wall, steady, monitor


def ledger(monitor: Any) -> dict[str, Any]:
    """The monitored fit's budget record (mpwatch's own seconds per part, the decisions)."""
    budget = getattr(monitor, "budget", None)  # None: an mpwatch from before the budget
    return budget.payload(monitor.explicit) if budget is not None else {}


def decisions_text(b: dict[str, Any]) -> str:
    parts = []
    for d in b.get("decisions") or []:
        cost = f" {d['cost_s']:.2f}s" if d.get("cost_s") is not None else ""
        parts.append(f"{d['part']}@{d['step']}:{d['action']}(est {d['estimate_s']:.2f}s{cost})")
    if len(parts) > 6:
        parts = parts[:3] + [f"... {len(parts) - 5} more ..."] + parts[-2:]
    return "; ".join(parts) or "-"


def measure(name: str, seconds: float, args: argparse.Namespace, root: str) -> dict[str, Any]:
    import keras

    rm = real_models()
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(args.policy)
    data = make_data(name, rm, args.batch_size)
    wall, steady, _ = fit_once(name, rm, args, data, args.calib)
    step = statistics.median(steady) if steady else wall / args.calib
    first = wall - step * (args.calib - 1)
    steps = max(MIN_STEPS, int(round((seconds - first) / step)))
    print(
        f"  {name} [{args.policy}] target {seconds:g} s: calibration first step {first:.2f} s, "
        f"step {1000 * step:.1f} ms -> {steps} steps",
        file=sys.stderr,
        flush=True,
    )
    kwargs = dict(args.monitor_kwargs)
    from mpwatch.record.runtime import program_cache

    if args.program_cache == "warm":  # a later run of the same script: its programs are kept
        os.environ["MPWATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache_", dir=root)
        warm = fit_once(name, rm, args, data, steps, kwargs, os.path.join(root, f"{name}_warm"))
        print(f"    warm-up monitored fit (not counted): {warm[0]:.1f} s", file=sys.stderr)
    pairs = []
    for rep in range(args.reps):
        order = ("plain", "mpwatch") if rep % 2 == 0 else ("mpwatch", "plain")
        got: dict[str, Any] = {}
        hits = program_cache.stats["hits"]
        for cfg in order:
            logdir = os.path.join(root, f"{name}_{seconds:g}_{rep}")
            if args.program_cache == "cold" and cfg == "mpwatch":  # a first run: nothing kept
                os.environ["MPWATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache_", dir=root)
            got[cfg] = fit_once(
                name, rm, args, data, steps, kwargs if cfg == "mpwatch" else None, logdir
            )
            print(f"    rep {rep + 1} {cfg}: {got[cfg][0]:.1f} s", file=sys.stderr, flush=True)
        (pw, ps, _), (mw, ms, mon) = got["plain"], got["mpwatch"]
        pairs.append(
            {
                "plain": pw,
                "mpwatch": mw,
                "ratio": mw / pw,
                "steady": (statistics.median(ms) / statistics.median(ps))
                if min(len(ms), len(ps)) >= STEADY_MIN
                else None,
                "budget": ledger(mon),
                "cache_hits": program_cache.stats["hits"] - hits,
            }
        )
        b, st = pairs[-1]["budget"], pairs[-1]["steady"]
        print(  # each pair as it ends: a run cut short still shows what it measured
            f"    rep {rep + 1} ratio {mw / pw:.3f}, steady {f'{st:.3f}' if st else '-'}, "
            f"own {b.get('own_seconds', 0):.2f} s; "
            f"{decisions_text(b)}",
            file=sys.stderr,
            flush=True,
        )
    return {"model": name, "seconds": seconds, "steps": steps, "pairs": pairs}


def goal(plain: float) -> float | None:
    if plain >= 60:
        return 1.10
    if plain >= 10:
        return 1.25
    return None


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import keras

    backend = keras.backend.backend()
    extra = ", ".join(f"{k}={v!r}" for k, v in args.monitor_kwargs.items()) or "defaults"
    print(
        f"\nwhole fit, MixedPrecisionMonitor ({extra}) / plain, backend {backend}, "
        f"{args.policy}, batch {args.batch_size}, {args.reps} interleaved pairs, program cache "
        f"{args.program_cache}"
    )
    head = ["model", "target", "steps", "plain s", "mpwatch s", "ratio (min..max)", "steady",
            "goal", "mpwatch own s (probe, profile)"]  # fmt: skip
    rows = []
    for r in results:
        pairs = r["pairs"]
        ratios = [p["ratio"] for p in pairs]
        plain = statistics.median(p["plain"] for p in pairs)
        steady = [p["steady"] for p in pairs if p["steady"] is not None]
        g = goal(plain)
        b = pairs[-1]["budget"]
        spent = b.get("spent") or {}
        own = (
            f"{b.get('own_seconds', 0):.2f} ({spent.get('probe', 0):.2f}, "
            f"{spent.get('profile', 0):.2f})"
        )
        rows.append(
            [
                r["model"],
                f"{r['seconds']:g} s",
                str(r["steps"]),
                f"{plain:.1f}",
                f"{statistics.median(p['mpwatch'] for p in pairs):.1f}",
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})",
                f"{statistics.median(steady):.3f}" if steady else "-",
                (
                    f"<= {g:.2f} {'met' if statistics.median(ratios) <= g else 'MISSED'}"
                    if g
                    else "(< 10 s)"
                ),
                own,
            ]
        )
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print("\nthe budget's decisions (last pair of each row):")
    for r in results:
        b = r["pairs"][-1]["budget"]
        print(
            f"  {r['model']} {r['seconds']:g} s: fit {b.get('fit_seconds', 0):.1f} s, own "
            f"{b.get('own_seconds', 0):.2f} s, programs loaded from the cache "
            f"{r['pairs'][-1].get('cache_hits', 0)}; {decisions_text(b)}"
        )


def per_backend(backends: str | None, argv: list[str] | None, script: str) -> int | None:
    """With several ``--backends`` (``"tensorflow,jax"``): ``script`` run once per backend, each
    in a process of its own (Keras fixes its backend when it is imported) with the same
    arguments, ``--backends`` set to that one; the exit codes or-ed. None for one backend or
    none (the caller measures in this process)."""
    names = [b for b in (backends or "").split(",") if b]
    if len(names) < 2:
        return None
    rest = list(argv if argv is not None else sys.argv[1:])
    i = rest.index("--backends")
    code = 0
    for backend in names:
        rest[i + 1] = backend
        env = {**os.environ, "KERAS_BACKEND": backend}
        code |= subprocess.call([sys.executable, os.path.abspath(script), *rest], env=env)
    return code


def parse_kwargs(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        out[key.strip()] = ast.literal_eval(value.strip())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        default="mobilenetv2,transformer",
        help=f"{', '.join(MODELS)}, or {APP}NAME for any keras.applications model "
        f"(e.g. {APP}DenseNet121: weights=None, {APP_SIZE}x{APP_SIZE}, 10 classes)",
    )
    ap.add_argument("--seconds", default="10,60", help="target plain fit lengths, s")
    ap.add_argument("--backends", default=None, help="tensorflow,jax: one process each")
    ap.add_argument("--policy", default="mixed_float16")
    ap.add_argument("--reps", type=int, default=2, help="interleaved pairs per row")
    ap.add_argument("--calib", type=int, default=12, help="steps of the calibration fit")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--monitor-args", default="", help='e.g. "probe_every=10,budget=None"')
    ap.add_argument("--huge-layers", type=int, default=1000)
    ap.add_argument("--devices", type=int, default=None, help="host devices (JAX on a CPU)")
    ap.add_argument(
        "--distribution", choices=("data_parallel", "model_parallel"), default=None,
        help="JAX: both fits under this keras.distribution over every device",
    )  # fmt: skip
    ap.add_argument(
        "--no-prebuild",
        dest="prebuild",
        action="store_false",
        help="leave the optimizer to be built inside Keras' first trace (TensorFlow then traces "
        "the plain fit's step twice; mpwatch's tap builds it first)",
    )
    ap.add_argument(
        "--keras-pipeline",
        action="store_true",
        help="TensorFlow: feed Keras a Python generator, which it wraps in prefetch(AUTOTUNE) "
        "(its teardown at a fit's end sometimes waits tens of seconds: see pipeline())",
    )
    ap.add_argument(
        "--program-cache", choices=("cold", "warm"), default="cold",
        help="cold: each monitored fit starts with an empty mpwatch cache (a first run: the "
        "probe's programs compiled); warm: one untimed monitored fit first fills it (a later "
        "run of the same script: they are loaded, mpwatch/record/runtime/program_cache.py)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    code = per_backend(args.backends, argv, __file__)
    if code is not None:
        return code
    names = [m for m in args.models.split(",") if m]
    import keras

    for n in names:
        app = getattr(keras.applications, n[len(APP) :], None) if n.startswith(APP) else None
        if n not in MODELS and not inspect.isfunction(app):  # (not a submodule: app:densenet)
            ap.error(f"--models: {n!r}: choose from {', '.join(MODELS)}, or {APP}NAME of "
                     "keras.applications")  # fmt: skip
    args.monitor_kwargs = parse_kwargs(args.monitor_args)
    if args.distribution:
        set_distribution(args.distribution)
    root = tempfile.mkdtemp(prefix="mpwatch_whole_fit_")
    results = []
    try:
        for name in names:
            for seconds in (float(s) for s in args.seconds.split(",") if s):
                results.append(measure(name, seconds, args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
