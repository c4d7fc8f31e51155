"""Cost of mpwatch's MixedPrecisionMonitor (default settings) on real models, measured in one run.

Models, all under ``mixed_float16`` (``--policy``) with Adam and sparse categorical crossentropy
on synthetic numpy data (fixed seed; a pool of 8 batches cycled by a generator,
``steps_per_epoch`` steps): ``keras.applications.ResNet50`` (64x64x3, 10 classes),
``keras.applications.MobileNetV2`` (96x96x3, 10 classes), and keras.io's "Text classification
with Transformer" (token + position embedding, one TransformerBlock with MultiHeadAttention, vocab
20000, maxlen 200, embed 32, 2 heads, ff 32, float32 softmax; an int32 input, as a float one is
cast to float16 and rounds the ids). ``--models huge`` (or ``--model huge``) runs the
``--huge-layers``-layer model of benchmarks/huge.py (its builder, data and compile: SGD, mse).
Per model it prints:

1. Steady-state step-time ratio, monitored / plain: two models built the same way, each traced
   once by a 2-batch plain fit, then ``--reps`` fits of ``--steps`` steps each, interleaved (one
   ``MixedPrecisionMonitor`` for all the monitored fits: one run continued over several ``fit``
   calls). A step's time is the wall time between consecutive ``on_train_batch_end`` calls of a
   timing callback placed after the monitor; the first ``WARMUP`` steps of each fit are left
   out. The median of the per-repetition ratios of median step times, and their min..max.
2. mpwatch's own host time per step: perf_counter accumulators around the bound
   ``on_train_batch_begin`` / ``on_train_batch_end`` of the monitor (its total, and its own work
   such as reading the tap) and of each part in ``monitor.parts`` (instance attributes shadow
   the methods; mpwatch's code is unchanged), over
   the same steady steps, the one-time work nested in them (probe, profiler) taken out; in ms
   per step and as a share of a plain step (goal <= 1%).
3. One-time costs per monitored fit: its first step minus the plain model's first step in the
   same repetition (the train function retraced with mpwatch's tap), its other left-out steps
   minus plain's (profiled in the first fit; the hooks' one-time work taken out), the probe
   (``ProbeMonitor._probe``: float32 twin, probe trace and run the first time), the profiler
   (``ProfileMonitor._start`` / ``_stop``) and the trace's conversion
   (``ProfileMonitor._convert``), and mpwatch's ``on_train_begin`` and ``on_epoch_end`` +
   ``on_train_end`` (the probe taken out); their sum as a multiple of the plain model's own first
   step in its first fit (Keras' trace; goal <= 1.5x for the first fit, <= 0.1x for later fits).
4. Whole-fit wall-time ratio, monitored / plain, on fresh models (build not timed): one fit of
   ``--steps`` steps (plain first), and three fits of ``--steps``/3 steps (monitored first); and
   the first step of each fresh model (Keras' trace of the train function, with mpwatch's tap or
   without: what the tap adds for a model whose first fit is monitored, where (3) counts the
   whole retrace of a model that had a plain fit before), in both orders, as the first to run
   also pays the process' one-time warm-ups.
5. Record sizes of the run of (1): bytes of its event files and of ``plugins/profile``.

Then a summary table, one row per model.

    python benchmarks/real_models.py [--models resnet50,mobilenetv2,transformer] [--steps 300]
        [--reps 3] [--batch-size 32] [--logdir DIR]
    python benchmarks/real_models.py --models transformer --steps 30 --reps 1  # ~40 s
    python benchmarks/real_models.py --models mobilenetv2 --steps 12 --reps 1 --batch-size 8
    python benchmarks/real_models.py --model huge --steps 60                   # 1,000 layers
    python benchmarks/real_models.py --whole-fit 10,60,300 --models mobilenetv2 --batch-size 8
        # whole fits at the monitor's defaults, its cost budget on (benchmarks/whole_fit.py)

On 2 CPU cores float16 is emulated: a MobileNetV2 step at batch 8 takes ~4 s, a ResNet50 step at
batch 4 ~7 s (the MobileNetV2 line above, or resnet50 with ``--steps 7 --reps 1 --batch-size 4``:
~10 min each), the Transformer's ~33 ms. Run one process at a time: on a shared machine the
ratios of one repetition move by tens of percent.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import glob  # noqa: E402
import importlib.util  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mpwatch  # noqa: E402
from mpwatch.record.callbacks.probe_monitor import ProbeMonitor  # noqa: E402
from mpwatch.record.callbacks.profile_capture import ProfileMonitor  # noqa: E402
from mpwatch.record.callbacks.step_time import gpu_device  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = 5  # steps left out at the start of each fit (tracing, the profiled batches 3-5)
POOL = 8  # distinct synthetic batches, cycled
MODELS = ("resnet50", "mobilenetv2", "transformer", "huge")
CONFIGS = ("plain", "mpwatch")
ONCE = ("first_step", "warmup", "probe", "profile", "convert", "begin", "end")
OWN = "MixedPrecisionMonitor itself"  # its own hook work: the tap read, the loss buffer


# --- models ---------------------------------------------------------------------------------------
class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras.io's: token embedding + position embedding, added."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(keras.ops.arange(0, keras.ops.shape(x)[-1], 1))
        return self.token_emb(x) + positions


class TransformerBlock(keras.layers.Layer):
    """keras.io's: self-attention and a Dense feed-forward, each with dropout, residual, norm."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs):
        out1 = self.layernorm1(inputs + self.dropout1(self.att(inputs, inputs)))
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))


def transformer(vocab=20000, maxlen=200, embed=32, heads=2, ff=32):
    # int32, not keras.io's default float32: a float input is cast to float16 by the mixed policy
    # before the lookup, which rounds ids >= 2048 (19999 -> 20000: out of range)
    inputs = keras.Input(shape=(maxlen,), dtype="int32")
    x = TokenAndPositionEmbedding(maxlen, vocab, embed)(inputs)
    x = TransformerBlock(embed, heads, ff)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(20, activation="relu")(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(2, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="transformer")


@functools.cache
def load_huge() -> Any:
    spec = importlib.util.spec_from_file_location("mpwatch_bench_huge", f"{HERE}/huge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(name: str, args: argparse.Namespace) -> Any:
    """A compiled model under the global policy, the same weights every call."""
    keras.utils.set_random_seed(0)
    if name == "huge":
        huge = load_huge()
        return huge.compile_model(huge.build_model(args.huge_layers, seed=0))
    if name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    elif name == "mobilenetv2":
        model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=10)
    else:
        model = transformer()
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    return model


def make_data(name: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    n = POOL * batch_size
    rng = np.random.default_rng(0)
    if name == "huge":
        return load_huge().synthetic_data(n, 16)
    if name == "transformer":
        return rng.integers(0, 20000, (n, 200)).astype("int32"), rng.integers(0, 2, n)
    size = 64 if name == "resnet50" else 96
    x = rng.uniform(0, 1, (n, size, size, 3)).astype("float32")
    return x, rng.integers(0, 10, n)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    i = 0
    while True:
        yield x[i : i + batch_size], y[i : i + batch_size]
        i = (i + batch_size) % len(x)


# --- timing ---------------------------------------------------------------------------------------
class Timer(keras.callbacks.Callback):
    """perf_counter at each batch hook (one first in the callback list, one last); the last one
    also notes the meter's one-time seconds so far at each batch end."""

    def __init__(self, meter=None):
        super().__init__()
        self.meter = meter
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.nested: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        self.nested.append(self.meter.nested if self.meter is not None else 0.0)


class Meter:
    """perf_counter accumulators around the bound methods of a MixedPrecisionMonitor and of its
    parts. Batch hooks: per step (the monitor's own total, and per part); one-time work (probe,
    profiler, conversion) is timed on its own and taken out of the hooks it runs in."""

    def __init__(self, monitor: Any) -> None:
        self.nested = 0.0  # seconds of one-time work so far (taken out of enclosing hooks)
        self.fits: list[dict[str, Any]] = []
        self._cur: dict[str, float] = defaultdict(float)
        self._wrap(monitor, "on_train_begin", "begin")
        self._wrap(monitor, "on_epoch_end", "end")
        self._wrap(monitor, "on_train_end", "end")
        self._wrap(monitor, "on_train_batch_begin", "hooks")
        self._wrap(monitor, "on_train_batch_end", "hooks", closes_step=True)
        for part in monitor.parts:
            for hook in ("on_train_batch_begin", "on_train_batch_end"):
                self._wrap(part, hook, type(part).__name__)
            if isinstance(part, ProbeMonitor):
                self._wrap(part, "_probe", "probe", once=True)
            if isinstance(part, ProfileMonitor):
                self._wrap(part, "_start", "profile", once=True)
                self._wrap(part, "_stop", "profile", once=True)
                self._wrap(part, "_convert", "convert", once=True)

    def new_fit(self) -> dict[str, Any]:
        self.fit = {"steps": [], "parts": defaultdict(list), **dict.fromkeys(ONCE[2:], 0.0)}
        self.fits.append(self.fit)
        self._cur.clear()
        return self.fit

    def _wrap(self, obj: Any, name: str, key: str, once: bool = False, closes_step=False) -> None:
        method, meter = getattr(obj, name), self

        def timed(*args, **kwargs):
            t0, nested0 = time.perf_counter(), meter.nested
            try:
                return method(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                if once:
                    meter.fit[key] += dt
                    meter.nested += dt
                elif key in ("begin", "end"):
                    meter.fit[key] += dt - (meter.nested - nested0)
                else:
                    meter._cur[key] += dt - (meter.nested - nested0)
                if closes_step:
                    hooks = meter._cur.pop("hooks", 0.0)
                    meter.fit["steps"].append(hooks)
                    meter.fit["parts"][OWN].append(hooks - sum(meter._cur.values()))
                    for part, seconds in meter._cur.items():
                        meter.fit["parts"][part].append(seconds)
                    meter._cur.clear()

        setattr(obj, name, timed)


def run_fit(model, data, steps: int, batch_size: int, monitor=None, meter=None) -> dict:
    """One fit of ``steps`` steps; its wall time, first step, steady step times, mpwatch's hooks."""
    head, tail = Timer(), Timer(meter)
    fit = meter.new_fit() if meter is not None else {}
    t0 = time.perf_counter()
    model.fit(
        batches(*data, batch_size),
        steps_per_epoch=steps,
        epochs=1,
        verbose=0,
        callbacks=[head, *([monitor] if monitor is not None else []), tail],
        shuffle=False,
    )
    fit["wall"] = time.perf_counter() - t0
    ends, nested, w = tail.ends, tail.nested, min(WARMUP, steps) - 1
    fit["first_step"] = ends[0] - head.begins[0]  # every callback's batch-0 hooks included
    # the other left-out steps (profiled in the first monitored fit), one-time work taken out
    fit["warm_steps"] = ends[w] - ends[0] - (nested[w] - nested[0])
    fit["step_times"] = [b - a for a, b in zip(ends[WARMUP - 1 :], ends[WARMUP:])]
    return fit


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- measurements ---------------------------------------------------------------------------------
def measure_steady(name: str, args: argparse.Namespace, data, logdir: str) -> dict[str, Any]:
    """Items 1-3: interleaved fits of two models traced once; mpwatch's hooks; one-time costs."""
    models, trace = {}, {}
    for cfg in CONFIGS:  # one model per config, built the same way and traced once
        models[cfg] = build(name, args)
        trace[cfg] = run_fit(models[cfg], data, 2, args.batch_size)["first_step"]
        progress(f"{name}: built and traced {cfg} ({trace[cfg]:.1f} s first step)")
    monitor = mpwatch.MixedPrecisionMonitor(log_dir=logdir)
    meter = Meter(monitor)
    fits: dict[str, list[dict]] = {cfg: [] for cfg in CONFIGS}
    for rep in range(args.reps):
        for cfg in CONFIGS if rep % 2 == 0 else reversed(CONFIGS):
            mon = (monitor, meter) if cfg == "mpwatch" else (None, None)
            fits[cfg].append(run_fit(models[cfg], data, args.steps, args.batch_size, *mon))
            progress(f"{name}: rep {rep + 1}/{args.reps} {cfg}: {fits[cfg][-1]['wall']:.1f} s")

    plain_step = median([t for f in fits["plain"] for t in f["step_times"]])
    ratios = [
        median(m["step_times"]) / median(p["step_times"])
        for p, m in zip(fits["plain"], fits["mpwatch"])
    ]
    host = [t for f in fits["mpwatch"] for t in f["steps"][WARMUP:]]
    parts = defaultdict(list)
    for f in fits["mpwatch"]:
        for part, seconds in f["parts"].items():
            parts[part].extend(seconds[WARMUP:])
    once = []
    for p, m in zip(fits["plain"], fits["mpwatch"]):
        costs = {k: m[k] for k in ONCE[2:]}
        costs["first_step"] = m["first_step"] - p["first_step"]
        costs["warmup"] = m["warm_steps"] - p["warm_steps"]
        once.append(costs)
    pairs = [  # per repetition: first step and wall time, plain and monitored
        (p["first_step"], m["first_step"], p["wall"], m["wall"])
        for p, m in zip(fits["plain"], fits["mpwatch"])
    ]
    return {
        "params": models["plain"].count_params(),
        "trace": trace["plain"],
        "plain_step": plain_step,
        "mpwatch_step": median([t for f in fits["mpwatch"] for t in f["step_times"]]),
        "ratios": ratios,
        "host_mean": statistics.fmean(host) if host else float("nan"),
        "host_median": median(host),
        "parts": {k: statistics.fmean(v) for k, v in parts.items() if v},
        "once": once,
        "pairs": pairs,
    }


def measure_whole_fit(name: str, args: argparse.Namespace, data, logdir: str) -> dict:
    """Item 4: monitored / plain wall time of whole fits on fresh models."""
    out = {}
    for n_fits in (1, 3):
        wall = {}
        # plain first, then mpwatch first: whichever runs first also pays the process' warm-ups
        for cfg in CONFIGS if n_fits == 1 else reversed(CONFIGS):
            model = build(name, args)
            monitor = None
            if cfg == "mpwatch":
                monitor = mpwatch.MixedPrecisionMonitor(log_dir=f"{logdir}_fresh{n_fits}")
            steps = args.steps // n_fits
            fits = [run_fit(model, data, steps, args.batch_size, monitor) for _ in range(n_fits)]
            wall[cfg] = sum(f["wall"] for f in fits)
            # a fresh model's first step: Keras' trace, with mpwatch's tap or without
            out.setdefault("first_step", {}).setdefault(cfg, []).append(fits[0]["first_step"])
            progress(f"{name}: fresh {cfg}, {n_fits} fit(s) of {steps} steps: {wall[cfg]:.1f} s")
            del model
            gc.collect()
        out[n_fits] = wall
    return out


def record_sizes(logdir: str) -> dict[str, int]:
    """Item 5: bytes of the event files and of plugins/profile under ``logdir``."""
    profile = os.path.join(logdir, "plugins", "profile")
    events = [
        p
        for p in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)
        if not p.startswith(profile)
    ]
    traces = [
        p for p in glob.glob(os.path.join(profile, "**"), recursive=True) if os.path.isfile(p)
    ]
    return {
        "event_files": len(events),
        "events": sum(os.path.getsize(p) for p in events),
        "profile": sum(os.path.getsize(p) for p in traces),
    }


# --- printing -------------------------------------------------------------------------------------
def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, ["-" * w for w in widths], *rows]:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  " + "  ".join(cells).rstrip())


def verdict(value: float, goal: float) -> str:
    return "met" if value <= goal else "MISSED"


def report_model(name: str, args: argparse.Namespace, r: dict[str, Any]) -> None:
    plain, ratios, trace = r["plain_step"], r["ratios"], r["trace"]
    host = r["host_mean"] / plain
    totals = [sum(c.values()) for c in r["once"]]
    rows = [
        [
            "1 steady step, plain / mpwatch (median)",
            f"{1000 * plain:.2f} / {1000 * r['mpwatch_step']:.2f} ms",
            "",
        ],
        [
            "1 step-time ratio mpwatch/plain, median (min..max)",
            f"{median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})",
            "",
        ],
        [
            "2 mpwatch host time per step, mean (median)",
            f"{1000 * r['host_mean']:.3f} ({1000 * r['host_median']:.3f}) ms",
            "",
        ],
        ["2   as % of a plain step (mean)", f"{100 * host:.2f}%", f"<= 1% {verdict(host, 0.01)}"],
    ]
    rows += [[f"2   {part}, mean", f"{1000 * sec:.3f} ms", ""] for part, sec in r["parts"].items()]
    rows += [
        ["3 plain model's first step in its first fit", f"{trace:.2f} s", ""],
        [
            "3 fit 1: mpwatch's one-time costs",
            f"{totals[0]:.2f} s = {totals[0] / trace:.2f}x",
            f"<= 1.5x {verdict(totals[0] / trace, 1.5)}",
        ],
    ]
    if len(totals) > 1:
        worst = max(totals[1:])
        rows.append(
            [
                "3 later fits: one-time costs, max",
                f"{worst:.2f} s = {worst / trace:.2f}x",
                f"<= 0.1x {verdict(worst / trace, 0.1)}",
            ]
        )
    for n_fits in (1, 3):
        wall = r["whole_fit"][n_fits]
        rows.append(
            [
                f"4 whole-fit ratio, fresh models, {n_fits} x {args.steps // n_fits} steps",
                f"{wall['mpwatch'] / wall['plain']:.3f} ({wall['mpwatch']:.1f} / "
                f"{wall['plain']:.1f} s)",
                "",
            ]
        )
    first = r["whole_fit"]["first_step"]
    for i, order in enumerate(("plain ran first", "mpwatch ran first")):
        m, p = first["mpwatch"][i], first["plain"][i]
        rows.append(
            [
                f"4 fresh model's first step (trace), mpwatch / plain, {order}",
                f"{m / p:.3f} ({m:.2f} / {p:.2f} s)",
                "",
            ]
        )
    sizes, steps = r["sizes"], args.reps * args.steps
    rows += [
        [
            f"5 event files ({sizes['event_files']}) of run 1 ({steps} steps)",
            f"{sizes['events']:,} B ({sizes['events'] / steps:,.0f} B/step)",
            "",
        ],
        ["5 plugins/profile of run 1", f"{sizes['profile']:,} B", ""],
    ]
    table(
        f"{name}: {r['params']:,} parameters, {args.policy}, batch {args.batch_size}, "
        f"{args.steps} steps/fit, {args.reps} interleaved reps, device {gpu_device() or 'CPU'}",
        ["measure", "value", "goal"],
        rows,
    )
    table(
        f"{name}: per fit, s: first step and whole fit of plain | mpwatch, and mpwatch's one-time "
        f"costs (x: total / {trace:.2f} s)",
        [
            "fit",
            "1st step",
            "fit",
            "first step +",
            "warm-up +",
            "probe",
            "profiler",
            "convert",
            "begin",
            "end",
            "total",
            "x",
        ],
        [
            [
                str(i + 1),
                f"{pf:.2f} | {mf:.2f}",
                f"{pw:.1f} | {mw:.1f}",
                *(f"{c[k]:.3f}" for k in ONCE),
                f"{total:.2f}",
                f"{total / trace:.2f}",
            ]
            for i, (c, total, (pf, mf, pw, mw)) in enumerate(zip(r["once"], totals, r["pairs"]))
        ],
    )


def report_summary(args: argparse.Namespace, results: dict[str, dict]) -> None:
    rows = []
    for name, r in results.items():
        totals = [sum(c.values()) / r["trace"] for c in r["once"]]
        wf = r["whole_fit"]
        rows.append(
            [
                name,
                f"{1000 * r['plain_step']:.1f}",
                f"{median(r['ratios']):.3f} ({min(r['ratios']):.3f}..{max(r['ratios']):.3f})",
                f"{1000 * r['host_mean']:.3f} / {100 * r['host_mean'] / r['plain_step']:.2f}%",
                f"{totals[0]:.2f}x",
                f"{max(totals[1:]):.2f}x" if len(totals) > 1 else "-",
                f"{wf[1]['mpwatch'] / wf[1]['plain']:.3f}",
                f"{wf[3]['mpwatch'] / wf[3]['plain']:.3f}",
                f"{r['sizes']['events']:,}",
                f"{r['sizes']['profile']:,}",
            ]
        )
    table(
        f"summary: MixedPrecisionMonitor (defaults) vs no callback, batch {args.batch_size}, "
        f"{args.steps} steps/fit, {args.reps} reps (goals: host <= 1%, one-time <= 1.5x first fit,"
        " <= 0.1x later fits)",
        [
            "model",
            "plain ms/step",
            "step ratio (min..max)",
            "host ms / %",
            "fit 1 once",
            "later once (max)",
            f"whole 1x{args.steps}",
            f"whole 3x{args.steps // 3}",
            "event B",
            "profile B",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> dict[str, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        default="resnet50,mobilenetv2,transformer",
        help=f"comma-separated, of {', '.join(MODELS)}",
    )
    ap.add_argument("--steps", type=int, default=300, help="batches per fit")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--logdir", default=None, help="kept when given (default: a temporary dir)")
    ap.add_argument("--huge-layers", type=int, default=1000, help="layers of --models huge")
    ap.add_argument(
        "--policy",
        default="mixed_float16",
        help="Keras dtype policy of both models (JAX on a CPU has no float16 matmul: "
        "mixed_bfloat16 there)",
    )
    ap.add_argument(
        "--whole-fit",
        default=None,
        metavar="SECONDS",
        help="instead: whole-fit ratios at the monitor's defaults (its cost budget) for plain "
        "fits of these lengths, e.g. 10,60,300 (benchmarks/whole_fit.py; KERAS_BACKEND picks "
        "the backend)",
    )
    args = ap.parse_args(argv)
    if args.whole_fit:
        spec = importlib.util.spec_from_file_location("mpwatch_whole_fit", f"{HERE}/whole_fit.py")
        whole = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(whole)
        whole.main(
            ["--models", args.models, "--seconds", args.whole_fit, "--reps", str(args.reps),
             "--batch-size", str(args.batch_size), "--policy", args.policy]
        )  # fmt: skip
        return {}
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if not names or set(names) - set(MODELS):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    if args.steps < WARMUP + 2 or args.steps < 3 or args.reps < 1:
        ap.error(f"--steps must be >= {WARMUP + 2} and --reps >= 1")

    root = args.logdir or tempfile.mkdtemp(prefix="mpwatch_bench_real_")
    results = {}
    for name in names:
        keras.backend.clear_session()  # also resets the global policy: set it after
        keras.mixed_precision.set_global_policy(args.policy)
        gc.collect()
        t0 = time.perf_counter()
        data = make_data(name, args.batch_size)
        logdir = os.path.join(root, name)
        r = measure_steady(name, args, data, logdir)
        gc.collect()
        r["whole_fit"] = measure_whole_fit(name, args, data, logdir)
        r["sizes"] = record_sizes(logdir)
        results[name] = r
        report_model(name, args, r)
        print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    report_summary(args, results)
    if args.logdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
