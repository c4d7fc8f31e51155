"""Where MixedPrecisionMonitor's cost goes on Keras' JAX backend, part by part: one model, one
process (the device machine of these sessions has JAX and no TensorFlow).

Each configuration gets a fresh model built the same way (``real_models.py``'s builders and
data). Its first fit (20 steps) is timed whole and read from JAX's own compile log
(``jax_log_compiles``): the seconds spent tracing, lowering and compiling the train step, and the
other programs compiled (Keras' own small ones in the first configuration; mpwatch's recording
adds none: tests/record/test_jax_backend.py). A ``jax.clear_caches()`` between them would also
drop the programs of the models built before. Then ``--alternations`` rounds, each fitting every
configuration for ``--steps`` steps in a rotated order (a new monitor per fit, as a user's new
``fit`` has), timed from the call to its return: per configuration the median ms/step, and the
median over rounds of its ratio to ``plain`` in the same round (drift cancels) with its range.

Last, unless ``--trace-steps 0``, each configuration fits ``--trace-steps`` steps under
``jax.profiler``; the trace is read with mpwatch's own reader (:mod:`mpwatch.profile.xplane`)
for the GPU kernels a step launches, the GPU's busy time a step (the union of its kernels'
intervals), and the kernels each configuration launches beyond ``plain`` (by name, per step,
with their time): what a tap adds on the device. A CPU has no kernels to show.

Configurations (``--configs``): ``plain`` (no callback: Keras then dispatches steps without ever
waiting), ``plain+hook`` (a callback with an empty ``on_train_batch_end``, which Keras runs on the
training thread: a sync per batch), ``mpwatch`` (defaults; the budget off here unless
``--budget``, so that each part's steady cost shows; on a GPU its gradient counts are in a
program of their own, run at the count steps only: ``mpwatch.record.tap.jax_programs``),
``mpwatch-apart`` / ``mpwatch-cond`` / ``mpwatch-select`` (the gradient counts in that second
program / under a ``lax.cond`` / computed every step and selected, whatever the device:
``JaxTap.counts_way``), ``mpwatch-nograd`` (no gradient counts), ``mpwatch-minimal`` (the loss
scale and the step time only). The counts' own program compiles on a thread (``jit(counts_step)``
in the compile log, under whichever fit was running when it ended).

    python benchmarks/gpu_cost.py --model transformer --policy mixed_bfloat16 --batch-size 64
    python benchmarks/gpu_cost.py --model resnet50 --configs plain,mpwatch,mpwatch-nograd

Measured on an H200 (2026-11-27, an earlier form of this script, 2 rounds, best of each): keras.io's
Transformer, mixed_bfloat16, batch 64, 2000 steps: plain 1.453 ms/step, plain+hook 1.740,
mpwatch 1.716, mpwatch-cond 1.673, mpwatch-nograd 1.486, mpwatch-minimal 1.452; rounds of the
same configuration differed by up to 25%, which the rounds here are for.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import collections  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = (
    "plain", "plain+hook", "mpwatch", "mpwatch-apart", "mpwatch-cond", "mpwatch-select",
    "mpwatch-nograd", "mpwatch-minimal",
)  # fmt: skip
NO_GRAD = {"gradient_health": False, "per_variable_gradients": False}
MINIMAL = {**NO_GRAD, "input_health": False, "layer_dtypes": False, "probe": False, "float8": False}


def real_models() -> Any:
    """benchmarks/real_models.py (its model builders and data), loaded by whole_fit.py as
    host_cost.py has it."""
    spec = importlib.util.spec_from_file_location("mpwatch_bench_whole", f"{HERE}/whole_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.real_models()


class CompileLog(logging.Handler):
    """JAX's compile log: seconds per phase of the train step, and the other programs."""

    def __init__(self) -> None:
        super().__init__()
        self.step: dict[str, float] = {}
        self.others: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        got = re.search(r" in ([0-9.e+-]+) sec", msg)
        if not msg.startswith("Finished") or got is None:
            return
        phase = "trace" if "tracing" in msg else "lower" if "MLIR" in msg else "compile"
        if "train_step" in msg:
            self.step[phase] = self.step.get(phase, 0.0) + float(got.group(1))
        elif phase == "compile":
            self.others.append(msg.split(" of ")[-1].split(" in ")[0])


def callbacks(cfg: str, logdir: str, args: argparse.Namespace) -> list[Any]:
    import keras

    import mpwatch

    if cfg == "plain":
        return []
    if cfg == "plain+hook":

        class Hook(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                pass

        return [Hook()]
    kwargs: dict[str, Any] = {"budget": "default" if args.budget else None}
    kwargs.update({"mpwatch-nograd": NO_GRAD, "mpwatch-minimal": MINIMAL}.get(cfg, {}))
    if not args.budget:
        kwargs.update(probe=False, profile=False)  # the steady cost, not the one-time parts
    return [mpwatch.MixedPrecisionMonitor(logdir, **kwargs)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import jax
    import keras

    from mpwatch.record.tap.jax_tap import JaxTap

    rm = real_models()
    keras.mixed_precision.set_global_policy(args.policy)
    x, y = rm.make_data(args.model, args.batch_size)
    ns = argparse.Namespace(huge_layers=args.huge_layers, batch_size=args.batch_size)
    root = tempfile.mkdtemp(prefix="mpwatch_gpu_cost_")
    log, jax_log = CompileLog(), logging.getLogger("jax")
    jax_log.addHandler(log)
    jax_log.setLevel(logging.DEBUG)
    jax_log.propagate = False
    jax.config.update("jax_log_compiles", True)
    ways = {"mpwatch-apart": "apart", "mpwatch-cond": "cond", "mpwatch-select": "select"}
    configs = [c for c in args.configs.split(",") if c]
    configs = sorted(configs, key=lambda c: c != "plain")  # plain first: the ratios' base
    models, first = {}, {}
    for cfg in configs:
        JaxTap.counts_way = ways.get(cfg)
        model = rm.build(args.model, ns)
        model.optimizer.build(model.trainable_variables)
        log.step, log.others = {}, []
        t0 = time.perf_counter()
        cbs = callbacks(cfg, os.path.join(root, cfg), args)
        model.fit(rm.batches(x, y, args.batch_size), steps_per_epoch=20, epochs=1, verbose=0,
                  callbacks=cbs)  # fmt: skip
        first[cfg] = {"wall": time.perf_counter() - t0, **log.step, "others": list(log.others)}
        models[cfg] = model
        print(f"  {cfg}: first fit {first[cfg]['wall']:.1f} s", file=sys.stderr, flush=True)
    jax.config.update("jax_log_compiles", False)
    per_step: dict[str, list[float]] = {c: [] for c in configs}
    ratios: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(args.alternations):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        got = {}
        for cfg in order:
            JaxTap.counts_way = ways.get(cfg)
            cbs = callbacks(cfg, os.path.join(root, cfg), args)
            t0 = time.perf_counter()
            models[cfg].fit(rm.batches(x, y, args.batch_size), steps_per_epoch=args.steps,
                            epochs=1, verbose=0, callbacks=cbs)  # fmt: skip
            got[cfg] = (time.perf_counter() - t0) / args.steps
            per_step[cfg].append(got[cfg])
        for cfg in configs:
            if "plain" in got:
                ratios[cfg].append(got[cfg] / got["plain"])
        print(f"  round {r + 1}: " + ", ".join(f"{c} {1e3 * got[c]:.3f}" for c in configs),
              file=sys.stderr, flush=True)  # fmt: skip
    kernels = {}
    for cfg in configs if args.trace_steps > 0 else []:
        JaxTap.counts_way = ways.get(cfg)
        kernels[cfg] = traced(
            models[cfg], cfg, args, lambda: rm.batches(x, y, args.batch_size), root
        )
    JaxTap.counts_way = None
    return {
        "first": first, "per_step": per_step, "ratios": ratios, "kernels": kernels,
        "device": str(jax.devices()[0]),
    }  # fmt: skip


def traced(model: Any, cfg: str, args: argparse.Namespace, data: Any, root: str) -> Any:
    """GPU kernels of ``--trace-steps`` steps of one configuration (None without a GPU plane):
    kernels and busy ms a step, and launches and µs a step by kernel name."""
    import glob

    import jax

    d = tempfile.mkdtemp(prefix=f"trace_{cfg.replace('+', '_')}_", dir=root)
    fit = functools.partial(model.fit, data(), epochs=1, verbose=0)
    logdir = os.path.join(root, cfg)
    fit(steps_per_epoch=5, callbacks=callbacks(cfg, logdir, args))
    jax.profiler.start_trace(d)
    try:
        fit(steps_per_epoch=args.trace_steps, callbacks=callbacks(cfg, logdir, args))
    finally:
        jax.profiler.stop_trace()
    files = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return None
    return kernel_summary(files[0], args.trace_steps)


def kernel_summary(path: str, steps: int) -> dict[str, Any] | None:
    """The GPU kernels of a trace (``.xplane.pb``) over ``steps`` steps: kernels and busy ms a
    step, and launches and µs a step by kernel name; None without a kernel."""
    from mpwatch.profile import xplane

    space = xplane.read_xspace(path, xplane.metadata_and_devices)
    spans, names = [], collections.Counter()
    micros: dict[str, float] = collections.defaultdict(float)
    for plane in space.device_planes:
        for line in plane.lines:
            for ev in line.events:
                if "kernel_details" not in ev.stats:  # memcpy, memset
                    continue
                begin = line.timestamp_ns * 1000 + ev.offset_ps
                spans.append((begin, begin + ev.duration_ps))
                names[ev.name] += 1
                micros[ev.name] += ev.duration_ps / 1e6
    if not spans:
        return None
    busy, end = 0, None  # the union of the kernels' intervals, picoseconds
    for b, e in sorted(spans):
        if end is None or b > end:
            busy, end = busy + (e - b), e
        elif e > end:
            busy, end = busy + (e - end), e
    n = steps
    return {
        "kernels": len(spans) / n,
        "busy_ms": busy / 1e9 / n,
        "by_name": {k: (c / n, micros[k] / n) for k, c in names.items()},
    }


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\nmpwatch's cost by part, backend jax, device {res['device']}, {args.model}, "
        f"{args.policy}, batch {args.batch_size}, {args.alternations} rounds of {args.steps} steps"
    )
    print("  config            ms/step   x plain (rounds' median, min..max)   first fit s  "
          "train step trace/lower/compile s  other programs")  # fmt: skip
    for cfg, times in res["per_step"].items():
        r = res["ratios"][cfg]
        ratio = f"x{statistics.median(r):.3f} ({min(r):.3f}..{max(r):.3f})" if r else "-"
        f = res["first"][cfg]
        phases = "/".join(f"{f.get(p, 0.0):.2f}" for p in ("trace", "lower", "compile"))
        print(f"  {cfg:16s} {1e3 * statistics.median(times):8.3f}   {ratio:34s} "
              f"{f['wall']:11.1f}  {phases:32s}  {len(f['others'])}")  # fmt: skip
    traces = res.get("kernels") or {}
    if not traces:
        return
    if not any(traces.values()):
        print("  (no GPU kernels in the traces: this device has none to show)")
        return
    base = traces.get("plain")
    print(f"\nGPU kernels, {args.trace_steps} traced steps a configuration")
    for cfg, k in traces.items():
        if not k:
            print(f"  {cfg:16s} no GPU kernels traced")
            continue
        print(f"  {cfg:16s} {k['kernels']:7.1f} kernels a step, GPU busy "
              f"{k['busy_ms']:.3f} ms a step")  # fmt: skip
        if base and cfg != "plain":
            more = {
                name: (c - base["by_name"].get(name, (0.0, 0.0))[0], us)
                for name, (c, us) in k["by_name"].items()
            }
            top = sorted((v for v in more.items() if v[1][0] > 0.5), key=lambda v: -v[1][1])
            for name, (extra, us) in top[:6]:
                print(f"      +{extra:5.1f} a step  {us:8.1f} us  {name[:90]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer", help="a model of real_models.py")
    ap.add_argument("--policy", default="mixed_bfloat16")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=500, help="steps of each timed fit")
    ap.add_argument("--alternations", type=int, default=6, help="rounds of every config")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--budget", action="store_true", help="the monitors at their default budget")
    ap.add_argument("--trace-steps", type=int, default=20, help="steps traced a config (0: none)")
    ap.add_argument("--huge-layers", type=int, default=1000)
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args(argv)
    import keras

    if keras.backend.backend() != "jax":
        ap.error("run under KERAS_BACKEND=jax (the compile log is JAX's)")
    bad = [c for c in args.configs.split(",") if c and c not in CONFIGS]
    if bad:
        ap.error(f"--configs: {', '.join(bad)}: choose from {', '.join(CONFIGS)}")
    res = run(args)
    report(res, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
