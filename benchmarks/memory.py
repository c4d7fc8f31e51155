"""Peak memory of a fit: plain, with MixedPrecisionMonitor at its defaults, and with probes forced.

For each backend and model, three configurations, each in a fresh process (a process' peak
resident memory never goes down, so configurations cannot share one):

- ``plain``: ``model.fit`` of ``--steps`` steps, no callback;
- ``defaults``: the same fit with ``MixedPrecisionMonitor(log_dir)`` (its cost budget decides
  whether a probe runs);
- ``probes``: ``MixedPrecisionMonitor(log_dir, probe_every=3)``: a probe every 3 steps (6 probes
  in the default 18 steps).

Each child process reports its peak resident memory (``ru_maxrss``) at the end of the fit and
after each batch; the probes' batch steps come from the monitor's own records. The parent prints,
per backend and model, each peak and its ratio to the plain fit's, and how far the peak grew from
the batch end after the first probe to the end of the fit, as a share of the plain peak (a probe
that keeps memory grows it probe after probe).

Models: ``wide_mlp`` (Dense 4096, 4096, 1024, 10 on 4096 inputs, 37.8M parameters, 144 MiB of
float32 weights, batch 4: the issue's), ``resnet50``
(``keras.applications.ResNet50(weights=None)`` at 64x64, batch 4), ``transformer`` (keras.io's
text classifier, batch 8). Policies: TensorFlow ``mixed_float16``, JAX ``mixed_bfloat16``
(``--policy`` for one of them).

Goals (issue 49): with a probe every 3 steps at most 1.15x the plain peak on both backends for
the wide MLP and ResNet50, the peak grows by less than 10% of the plain peak across 6 probes, at
defaults at most 1.05x.

    python benchmarks/memory.py                                   # everything (~15 min, 2 cores)
    python benchmarks/memory.py --backends jax --models wide_mlp
    python benchmarks/memory.py --backends tensorflow --models resnet50 --steps 18
    python benchmarks/memory.py --models wide_mlp --monitor-args float8=false

Every configuration builds the optimizer before its fit (see :func:`build`).

What resident memory holds on a CPU beside the buffers:

- on TensorFlow, every graph mpwatch traces, whether it runs or not: about 20 KiB of resident
  memory an operation (its traced graph about 8, its optimized and instantiated copy about 10, on
  TensorFlow 2.21). The probe's function of ResNet50 is about 16,000 operations (its two passes
  most of them), the tapped train step's gradient counts 1,360 (``record/tap/tf_chunks.py``);
- on JAX, the probe program's compile and its executable (ResNet50: loading it from mpwatch's
  program cache raised the process' resident memory by 666 MiB, compiling it by about 1.2 GB),
  and its temporaries (XLA's analysis: 393 MiB, of which its two passes 356 and one pass alone
  204, as much as the train step's own); the tapped train step's counts under a ``lax.cond``
  make its program 27% larger, and its compile larger with it (+150 MiB at ResNet50's defaults).
  On a GPU only the buffers are device memory.

A run's figures move by 20-60 MiB from one process to the next: compare ratios of one run, and
repeat a close one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ("wide_mlp", "resnet50", "transformer")
CONFIGS = ("plain", "defaults", "probes")
POLICY = {"tensorflow": "mixed_float16", "jax": "mixed_bfloat16"}


def rss_mib() -> float:
    """This process' peak resident memory so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --- the child: one fit in this process -----------------------------------------------------------
def build(name: str):
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if name == "wide_mlp":
        model = keras.Sequential(
            [keras.Input((4096,))]
            + [keras.layers.Dense(4096, activation="relu") for _ in range(2)]
            + [keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10, dtype="float32")]
        )
        x, y = rng.normal(size=(64, 4096)).astype("float32"), rng.integers(0, 10, 64)
        batch = 4
    elif name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
        x = rng.uniform(0, 1, (64, 64, 64, 3)).astype("float32")
        y, batch = rng.integers(0, 10, 64), 4
    elif name == "transformer":
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_real", f"{HERE}/real_models.py")
        real = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real)
        model = real.transformer()
        x = rng.integers(0, 20000, (64, 200)).astype("int32")
        y, batch = rng.integers(0, 2, 64), 8
    else:
        raise SystemExit(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=name == "wide_mlp")
    model.compile(keras.optimizers.Adam(1e-4), loss)
    # the optimizer built before the fit, in every configuration: Keras on TensorFlow otherwise
    # creates a LossScaleOptimizer's variables inside the train step's first trace and traces it
    # twice (200 MiB more peak for the wide MLP), which mpwatch's tap avoids: the plain fit
    # would be the larger one
    model.optimizer.build(model.trainable_variables)
    return model, x, y, batch


def monitor_kwargs(text: str) -> dict:
    """``"a=1,b=false"`` as keyword arguments (ints, floats, booleans, None, else strings)."""
    out: dict = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, raw = item.partition("=")
        low = raw.lower()
        value: object = {"true": True, "false": False, "none": None}.get(low, raw)
        if value is raw:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def child(
    backend: str, model_name: str, config: str, steps: int, policy: str, extra: str = ""
) -> dict:
    import keras

    import mpwatch

    keras.mixed_precision.set_global_policy(policy)
    model, x, y, batch = build(model_name)
    peaks: list[float] = []

    class Peaks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            peaks.append(rss_mib())

    callbacks: list = []
    logdir = tempfile.mkdtemp(prefix="mpwatch_memory_")
    if config == "defaults":
        callbacks.append(mpwatch.MixedPrecisionMonitor(logdir, **monitor_kwargs(extra)))
    elif config == "probes":
        kwargs = {"probe_every": 3, **monitor_kwargs(extra)}
        callbacks.append(mpwatch.MixedPrecisionMonitor(logdir, **kwargs))
    before = rss_mib()
    n = batch * steps
    reps = -(-n // len(x))
    xs = x if reps == 1 else __import__("numpy").concatenate([x] * reps)
    ys = y if reps == 1 else __import__("numpy").concatenate([y] * reps)
    model.fit(xs[:n], ys[:n], batch_size=batch, epochs=1, verbose=0,
              callbacks=callbacks + [Peaks()])  # fmt: skip
    probes: list[int] = []
    if config != "plain":
        run = mpwatch.load_run(logdir, traces=False)
        probes = sorted(int(s) for s in run.probe_model["step"]) if len(run.probe_model) else []
    return {"before_fit": before, "peak": rss_mib(), "peaks": peaks, "probes": probes}


# --- the parent: one process per configuration ----------------------------------------------------
def run_child(backend: str, model: str, config: str, args: argparse.Namespace) -> dict:
    policy = args.policy or POLICY[backend]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))  # fmt: skip
    env.setdefault("MPWATCH_CACHE_DIR", tempfile.mkdtemp(prefix="mpwatch_cache_"))
    cmd = [sys.executable, __file__, "--child", backend, model, config,
           "--steps", str(args.steps), "--policy", policy,
           "--monitor-args", args.monitor_args]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def growth(result: dict, steps: list[int]) -> float | None:
    """The peak's rise from the batch end of the first probe to the end of the fit, MiB."""
    peaks = result.get("peaks") or []
    if not steps or not peaks or steps[0] > len(peaks):
        return None
    return result["peak"] - peaks[steps[0] - 1]


def report(backend: str, model: str, got: dict[str, dict]) -> None:
    plain = got["plain"].get("peak")
    print(f"\n{backend} {model} ({', '.join(CONFIGS)}; peak resident memory of the process)")
    for config in CONFIGS:
        r = got[config]
        if "error" in r:
            print(f"  {config:9s} failed: {r['error'][0]}")
            continue
        ratio = f"{r['peak'] / plain:.3f}x" if plain else "-"
        line = f"  {config:9s} peak {r['peak']:8,.0f} MiB  {ratio}"
        if r.get("probes"):
            rise = growth(r, r["probes"])
            line += f"  probes at {r['probes']}"
            if rise is not None and plain:
                line += f"; peak grew {rise:,.0f} MiB after the first ({rise / plain:.1%} of plain)"
        print(line, flush=True)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="tensorflow,jax")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=18)
    p.add_argument("--policy", default=None)
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--monitor-args", default="",
                   help="keyword arguments of the monitored fits, e.g. float8=false")  # fmt: skip
    p.add_argument("--child", nargs=3, metavar=("BACKEND", "MODEL", "CONFIG"))
    args = p.parse_args(argv)
    if args.child:
        backend, model, config = args.child
        policy = args.policy or POLICY[backend]
        out = child(backend, model, config, args.steps, policy, args.monitor_args)
        print(json.dumps(out))
        return out
    results: dict = {}
    for backend in args.backends.split(","):
        for model in args.models.split(","):
            got = {c: run_child(backend, model, c, args) for c in CONFIGS}
            results[(backend, model)] = got
            report(backend, model, got)
    return results


if __name__ == "__main__":
    if "--child" in sys.argv:
        os.environ["KERAS_BACKEND"] = sys.argv[sys.argv.index("--child") + 1]
    main()
