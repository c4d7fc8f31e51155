"""Huge: a real 1,000-layer model under mpwatch, and 100,000 steps x 1,000 layers of logs.

Part 1 (recording). Builds a real Keras functional model of ``--layers`` layers (default 1,000, the
input layer not counted: a Dense stem, residual blocks Dense(no bias) -> ReLU -> Add with a
LayerNormalization after every ``--norm-every``-th block, a float32 Dense output) under
``mixed_float16`` and trains it with ``model.fit`` on synthetic in-memory data, in three configs
interleaved over ``--reps`` repetitions in one process (one model per config, each traced once by
a short plain warm-up fit, as benchmarks/overhead.py does):

- ``plain``: no callback;
- ``mpwatch``: ``mpwatch.MixedPrecisionMonitor`` at default settings (probe every 500 steps and at
  each epoch's end, profiler trace of batches 3-5 of its first fit);
- ``mpwatch_noprof``: the same with ``profile=False``.

One monitor per config for the whole benchmark (one long run over several ``fit`` calls, as a user
continuing training would have), so the probe's one-time trace is paid once per config, in its
first fit. A step's time is the wall time between consecutive ``on_train_batch_end`` calls (every
callback's work included); each fit's first batch and the ``--warmup`` steps after it are left
out. Prints the median step time per config (and each fit's) and its ratio to plain (goal 1.02 at
defaults), mpwatch's own host time per step (its batch hooks, timed inside each step between a
callback before and one after it: unlike step-time ratios, immune to a shared machine's drift
between fits), the whole-fit ratio, the one-time costs mpwatch adds per fit (fit call -> first
batch, first batch, the warm-up steps, last batch -> fit returns) in its first fit and in later
ones, and the size of every mpwatch record written, read back independently with
``tf.compat.v1.train.summary_iterator`` (payload bytes, event bytes, ``parts`` of split probe
records), each checked against ``mpwatch.contract.MAX_RECORD_BYTES``, with the event files' total
bytes and bytes per training step.

Part 2 (reading). Builds a synthetic logdir of ``--reader-steps`` steps (default 100,000) of a
``--layers``-layer model with ``--reader-probes`` probe records (``build_logdir`` of
benchmarks/reader.py) and times ``mpwatch.load_run`` on it. The tab on the same scale is
benchmarks/plugin.py (a real TensorBoard, each JSON route, headless Chromium); ``--with-tab`` runs
it at the end.

    python benchmarks/huge.py                                # ~12 min on 2 CPU cores
    python benchmarks/huge.py --layers 1000 --steps 60 --reps 3 --with-tab
    python benchmarks/huge.py --skip-fit                     # the reader only
    python benchmarks/plugin.py --steps 100000 --layers 1000 # the tab at this scale

On a CPU the first fit under mpwatch is dominated by tracing: the train function is retraced with
mpwatch's gradient tap at every ``fit``, and the probe's float32-reference function (per-layer
statistics of 1,000 layers) is traced once; both are printed as one-time costs.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = ("plain", "mpwatch", "mpwatch_noprof")


def build_model(layers: int = 1000, width: int = 16, norm_every: int = 10, seed: int = 0) -> Any:
    """A functional model of exactly ``layers`` layers (InputLayer not counted) under the current
    global policy: Dense stem, residual blocks Dense(no bias) -> ReLU -> Add (a
    LayerNormalization after every ``norm_every``-th block), Dense(no bias) padding, and a
    float32 ``Dense(1)`` output named ``out``. Few variables per layer: tracing a 1,000-layer train
    step on a CPU costs ~0.1 s per trainable variable under ``mixed_float16``."""
    import keras

    if layers < 2:
        raise ValueError("layers must be >= 2")
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((width,), name="x")
    h = keras.layers.Dense(width, name="stem")(inputs)
    n, block = 1, 0  # layers so far (the stem); the output layer comes last
    while n + 3 <= layers - 1:
        d = keras.layers.Dense(width, use_bias=False, name=f"b{block}_dense")(h)
        d = keras.layers.Activation("relu", name=f"b{block}_relu")(d)
        h = keras.layers.Add(name=f"b{block}_add")([h, d])
        n += 3
        if norm_every and block % norm_every == norm_every - 1 and n + 1 <= layers - 1:
            h = keras.layers.LayerNormalization(name=f"b{block}_norm")(h)
            n += 1
        block += 1
    while n < layers - 1:
        h = keras.layers.Dense(width, use_bias=False, name=f"pad{n}")(h)
        n += 1
    outputs = keras.layers.Dense(1, dtype="float32", name="out")(h)
    model = keras.Model(inputs, outputs, name=f"huge{layers}")
    count = sum(1 for ly in model.layers if type(ly).__name__ != "InputLayer")
    assert count == layers, (count, layers)
    return model


def synthetic_data(samples: int, width: int, seed: int = 0) -> tuple[Any, Any]:
    """Inputs ~ N(0, 1) and a target that depends on them (a fixed random projection)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, width)).astype("float32")
    y = (x @ rng.standard_normal((width, 1)) / np.sqrt(width)).astype("float32")
    return x, y


def compile_model(model: Any) -> Any:
    import keras

    model.compile(keras.optimizers.SGD(1e-3), "mse")
    return model


def _load_sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"mpwatch_bench_{name}", os.path.join(HERE, f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- record sizes, read independently of mpwatch's reader ----------------------------------------
def record_sizes(logdir: str) -> dict[str, Any]:
    """Per record kind: payload and event sizes as TensorFlow's own event iterator reads them."""
    import tensorflow as tf

    from mpwatch import contract

    tf.get_logger().setLevel("ERROR")  # summary_iterator's deprecation notice
    kinds: dict[str, dict[str, Any]] = {}
    files = sorted(glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True))
    total = 0
    max_step = 0
    for path in files:
        total += os.path.getsize(path)
        for event in tf.compat.v1.train.summary_iterator(path):
            max_step = max(max_step, int(event.step))
            for value in event.summary.value:
                if not value.tag.startswith(contract.RECORD_PREFIX):
                    continue
                kind = value.tag[len(contract.RECORD_PREFIX) :]
                blob = value.tensor.string_val[0]
                entry = kinds.setdefault(
                    kind, {"count": 0, "payload": [], "event": [], "steps": [], "parts": 0}
                )
                entry["count"] += 1
                entry["payload"].append(len(blob))
                entry["event"].append(event.ByteSize())
                entry["steps"].append(int(event.step))
                payload = contract.decode_payload(blob)
                entry["parts"] = max(entry["parts"], int(payload.get("parts", 1) or 1))
    return {"kinds": kinds, "files": len(files), "bytes": total, "max_step": max_step}


# --- part 1: the fit ------------------------------------------------------------------------------
def bench_fit(args: argparse.Namespace) -> dict[str, Any]:
    import keras

    import mpwatch
    from mpwatch import contract
    from mpwatch.record.callbacks.step_time import gpu_device

    keras.mixed_precision.set_global_policy("mixed_float16")
    x, y = synthetic_data(args.steps * args.batch_size, args.width)

    class Timer(keras.callbacks.Callback):
        """Notes when each batch hook is entered (first in the list: before mpwatch's)."""

        def __init__(self) -> None:
            super().__init__()
            self.begins: list[float] = []
            self.ends: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self.begins.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    class Done(Timer):
        """Last in the list: after mpwatch's hooks. (Done - Timer) = mpwatch's host time."""

    tmp = tempfile.mkdtemp(prefix="mpwatch_bench_huge_")
    logdirs = {"mpwatch": f"{tmp}/mpwatch", "mpwatch_noprof": f"{tmp}/mpwatch_noprof"}
    monitors = {
        "plain": None,
        "mpwatch": mpwatch.MixedPrecisionMonitor(log_dir=logdirs["mpwatch"]),
        "mpwatch_noprof": mpwatch.MixedPrecisionMonitor(
            log_dir=logdirs["mpwatch_noprof"], profile=False
        ),
    }
    models: dict[str, Any] = {}
    trace_s: dict[str, float] = {}
    t = time.perf_counter()
    for name in CONFIGS:  # one model per config (same seed), built and traced once before timing
        model = compile_model(build_model(args.layers, args.width, args.norm_every, seed=0))
        t0 = time.perf_counter()
        model.fit(
            x[: 2 * args.batch_size],
            y[: 2 * args.batch_size],
            batch_size=args.batch_size,
            shuffle=False,
            verbose=0,
        )
        trace_s[name] = time.perf_counter() - t0
        models[name] = model
        print(f"built and traced {name}: {trace_s[name]:.1f} s", file=sys.stderr, flush=True)
    m0 = models["plain"]
    n_vars = len(m0.trainable_variables)
    print(
        f"{args.layers} layers, {n_vars} trainable variables, {m0.count_params():,} parameters: "
        f"built and traced 3 models in {time.perf_counter() - t:.1f} s",
        file=sys.stderr,
        flush=True,
    )

    step: dict[str, list[float]] = {k: [] for k in CONFIGS}
    hooks: dict[str, list[float]] = {k: [] for k in CONFIGS}  # per step: batch hooks' time
    rep_med: dict[str, list[float]] = {k: [] for k in CONFIGS}  # each fit's median step
    wall: dict[str, list[float]] = {k: [] for k in CONFIGS}
    # per fit: (fit call -> first batch begins, first batch, the warm-up steps after it,
    # last batch end -> fit returns)
    once: dict[str, list[tuple[float, ...]]] = {k: [] for k in CONFIGS}
    for rep in range(args.reps):
        order = list(CONFIGS) if rep % 2 == 0 else list(reversed(CONFIGS))
        for name in order:
            timer, done = Timer(), Done()
            cbs = [timer] + ([monitors[name]] if monitors[name] is not None else []) + [done]
            t0 = time.perf_counter()
            models[name].fit(
                x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=cbs
            )
            t1 = time.perf_counter()
            wall[name].append(t1 - t0)
            ends = timer.ends
            times = [b - a for a, b in zip(ends[args.warmup :], ends[args.warmup + 1 :])]
            step[name].extend(times)
            rep_med[name].append(statistics.median(times))
            w = args.warmup + 1
            hooks[name].extend(
                (db - b) + (de - e)
                for b, db, e, de in zip(
                    timer.begins[w:], done.begins[w:], timer.ends[w:], done.ends[w:]
                )
            )
            once[name].append(
                (
                    timer.begins[0] - t0,
                    ends[0] - timer.begins[0],
                    ends[args.warmup] - ends[0],
                    t1 - ends[-1],
                )
            )
            print(
                f"rep {rep + 1}/{args.reps} {name}: fit {t1 - t0:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    med = {k: statistics.median(v) for k, v in step.items()}
    wmed = {k: statistics.median(v) for k, v in wall.items()}
    print(
        f"model: {args.layers}-layer functional model ({n_vars} trainable variables, "
        f"{m0.count_params():,} parameters, width {args.width}), mixed_float16, SGD, batch "
        f"{args.batch_size}, {args.steps} steps/fit, {args.reps} interleaved repetitions, "
        f"device: {gpu_device() or 'CPU'}"
    )
    print(
        f"plain train step traced once per model (warm-up fit of 2 batches): "
        f"{statistics.median(trace_s.values()):.1f} s"
    )
    print(
        "median step time  "
        + "  ".join(f"{k} {1000 * med[k]:.2f} ms" for k in CONFIGS)
        + f"  (first {args.warmup + 1} steps of each fit left out)"
    )
    print(
        "  each fit's median, ms: "
        + "; ".join(f"{k} " + ", ".join(f"{1000 * v:.2f}" for v in rep_med[k]) for k in CONFIGS)
    )
    for name, label in (("mpwatch", "defaults"), ("mpwatch_noprof", "profile=False")):
        per_rep = [a / b for a, b in zip(rep_med[name], rep_med["plain"])]
        print(
            f"MixedPrecisionMonitor ({label}): median step-time ratio "
            f"{med[name] / med['plain']:.3f} (goal <= 1.02; per repetition "
            + ", ".join(f"{r:.3f}" for r in per_rep)
            + f"); whole-fit ratio {wmed[name] / wmed['plain']:.3f} (median fit "
            f"{wmed[name]:.1f} s vs plain {wmed['plain']:.1f} s)"
        )
        own = statistics.median(hooks[name]) - statistics.median(hooks["plain"])
        print(
            f"  mpwatch's own batch hooks (host, measured inside each step): median "
            f"{1000 * own:.3f} ms per step = {own / med['plain']:.3f} of a plain step"
        )

    def cols(c: list[float] | tuple[float, ...]) -> str:
        return " | ".join(f"{v:7.2f}" for v in c)

    p = [statistics.median(c[i] for c in once["plain"]) for i in range(4)]
    print(
        f"one-time costs per fit, seconds (fit call -> first batch | first batch | steps 2-"
        f"{args.warmup + 1}, left out of the medians | last batch -> fit returns):"
    )
    print(f"  plain (median over fits):          {cols(p)}")
    for name in CONFIGS[1:]:
        first = once[name][0]
        print(
            f"  {name:15} first fit:         {cols(first)}   (added: {sum(first) - sum(p):.1f} s)"
        )
        if len(once[name]) > 1:
            later = [statistics.median(c[i] for c in once[name][1:]) for i in range(4)]
            print(
                f"  {name:15} later fits median: {cols(later)}   (added: "
                f"{sum(later) - sum(p):.1f} s)"
            )

    limit = contract.MAX_RECORD_BYTES
    ok = True
    for name in CONFIGS[1:]:
        sizes = record_sizes(logdirs[name])
        steps_run = args.reps * args.steps
        print(
            f"records written by {name} ({sizes['files']} event files, {sizes['bytes']:,} bytes, "
            f"{sizes['bytes'] / max(steps_run, 1):,.0f} bytes per training step over "
            f"{steps_run} steps; limit {limit:,} bytes per record payload):"
        )
        for kind, e in sorted(sizes["kinds"].items()):
            worst = max(e["payload"])
            ok = ok and worst <= limit and max(e["event"]) <= limit
            print(
                f"  {kind:15} {e['count']:4d} records  payload max {worst:9,} B  median "
                f"{statistics.median(e['payload']):9,.0f} B  event max {max(e['event']):9,} B  "
                f"parts {e['parts']}  {'ok' if worst <= limit else 'OVER THE LIMIT'}"
            )
    print(f"every record under MAX_RECORD_BYTES: {'yes' if ok else 'NO'}")
    shutil.rmtree(tmp, ignore_errors=True)
    return {"step": med, "wall": wmed, "records_ok": ok}


# --- part 2: reading 100,000 steps ----------------------------------------------------------------
def bench_reader(args: argparse.Namespace) -> dict[str, Any]:
    import mpwatch

    build_logdir = _load_sibling("reader").build_logdir
    tmp = tempfile.mkdtemp(prefix="mpwatch_bench_huge_reader_")
    path = os.path.join(tmp, "run")
    try:
        t = time.perf_counter()
        truth = build_logdir(path, args.reader_steps, args.reader_probes, args.layers)
        built = time.perf_counter() - t
        times = []
        run = None
        for _ in range(3):
            t = time.perf_counter()
            run = mpwatch.load_run(path)
            times.append(time.perf_counter() - t)
        n_values = int(run.scalars.notna().to_numpy().sum())
        assert n_values == truth["scalar_events"], (n_values, truth["scalar_events"])
        assert len(run.layers) == args.layers
        assert len(run.probe_model) == truth["probes"]
        print(
            f"reader: built {args.reader_steps:,} steps x {args.layers} layers "
            f"({truth['scalar_events']:,} scalar events, {truth['probes']} probe records, "
            f"{truth['bytes'] / 2**20:.1f} MiB) in {built:.1f} s; mpwatch.load_run "
            f"{statistics.median(times):.2f} s (median of 3: "
            + ", ".join(f"{x:.2f}" for x in times)
            + f"), {len(run.scalars):,} steps, {len(run.layers)} layers, "
            f"{len(run.probes):,} probe rows"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"load_run_s": statistics.median(times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=60, help="batches per fit")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--width", type=int, default=16, help="units of every Dense layer")
    ap.add_argument("--norm-every", type=int, default=10, help="a LayerNormalization per N blocks")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out after each fit's first")
    ap.add_argument("--reader-steps", type=int, default=100_000)
    ap.add_argument("--reader-probes", type=int, default=10)
    ap.add_argument("--skip-fit", action="store_true", help="part 2 only")
    ap.add_argument("--with-tab", action="store_true", help="also run benchmarks/plugin.py")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup + 1:
        ap.error("--steps must exceed --warmup + 1")

    if not args.skip_fit:
        bench_fit(args)
    bench_reader(args)
    if args.with_tab:
        plugin_args = ["--steps", str(args.reader_steps), "--layers", str(args.layers)]
        print(f"tab: python benchmarks/plugin.py {' '.join(plugin_args)}", flush=True)
        _load_sibling("plugin").main(plugin_args)
    else:
        print(
            f"tab: python benchmarks/plugin.py --steps {args.reader_steps} --layers {args.layers}"
            " (or --with-tab)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
