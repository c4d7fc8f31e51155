"""A fit whose batch fills the device: trained plain, with the monitor at its defaults, and with
probes forced; none may fail (issue 54, "Never the reason a fit fails" on a real GPU).

Users size the batch to fill the device. This script finds the batch of an activation-heavy MLP
(``--depth`` Dense layers of ``--width`` units on ``--in-dim`` inputs, ``--policy``) whose plain
fit peaks at ``--target`` (default 0.85) of the device's memory, from two calibration fits, then
trains it three ways, each in a fresh process (JAX's peak is per process):

- ``plain``: no callback;
- ``defaults``: ``MixedPrecisionMonitor(log_dir)`` (the budget decides; ``--default-steps`` reach
  a gradient-count step);
- ``probes``: ``MixedPrecisionMonitor(log_dir, probe_every=2, log_every=2)``.

Per fit: whether it finished, its peak device memory (JAX's ``peak_bytes_in_use``) as a share of
the device's memory and of JAX's limit, and for the monitored fits what mpwatch recorded: each
probe's need and the free memory it saw, the part of the batch it ran on, the budget's skips and
the run's notices. The probe's added device memory is the probes fit's peak less the plain one's.

``XLA_PYTHON_CLIENT_MEM_FRACTION`` is raised to 0.95 (JAX's default lets it use 75% of the
device) so that "fills the device" means the device, not JAX's default share.

    KERAS_BACKEND=jax python benchmarks/device_fill.py --json fill.json
    KERAS_BACKEND=jax python benchmarks/device_fill.py --cpu-smoke   # the pipeline, tiny, on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
FRACTION = "0.95"


def device_memory() -> dict[str, Any]:
    """The device's memory as JAX reports it (bytes), and its physical size from nvidia-smi."""
    import jax

    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    out = {
        "platform": dev.platform,
        "kind": getattr(dev, "device_kind", ""),
        "bytes_limit": stats.get("bytes_limit"),
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "bytes_in_use": stats.get("bytes_in_use"),
    }
    try:
        total = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        ).stdout.split()
        out["physical_bytes"] = int(total[0]) * 2**20 if total else None
    except Exception:  # noqa: BLE001 - a CPU, or no nvidia-smi
        out["physical_bytes"] = None
    return out


def build(args: argparse.Namespace) -> Any:
    import keras

    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.in_dim,))]
    for _ in range(args.depth):
        layers.append(keras.layers.Dense(args.width, activation="relu"))
    layers.append(keras.layers.Dense(10, dtype="float32"))
    model = keras.Sequential(layers, name="fill_mlp")
    model.compile(
        keras.optimizers.Adam(1e-4),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.optimizer.build(model.trainable_variables)
    return model


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One fit in this process; what it did and its peak."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.in_dim), dtype=np.float32)
    y = rng.integers(0, 10, args.batch).astype("int32")
    res: dict[str, Any] = {"config": args.child, "batch": args.batch}
    steps = args.default_steps if args.child == "defaults" else args.steps

    def data():
        while True:
            yield x, y

    model = build(args)
    callbacks: list[Any] = []
    logdir = tempfile.mkdtemp(prefix=f"fill_{args.child}_")
    if args.child != "plain":
        import mpwatch

        kw: dict[str, Any] = {}
        if args.child == "probes":
            kw = {"probe_every": 2, "log_every": 2}
        callbacks.append(mpwatch.MixedPrecisionMonitor(logdir, **kw))
    t0 = time.perf_counter()
    try:
        hist = model.fit(data(), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
        res["finished"] = True
        res["loss"] = [float(v) for v in hist.history.get("loss", [])]
    except Exception as err:  # noqa: BLE001 - the finding: the fit failed
        res["finished"] = False
        res["error"] = f"{type(err).__name__}: {str(err)[:600]}"
        traceback.print_exc()
    res["fit_s"] = round(time.perf_counter() - t0, 2)
    res["steps"] = steps
    res.update(device_memory())
    if args.child != "plain":
        res["mpwatch"] = read_back(logdir)
    return res


def read_back(logdir: str) -> dict[str, Any]:
    """What mpwatch recorded: each probe's memory need, the part of the batch, the skips."""
    out: dict[str, Any] = {}
    try:
        import mpwatch

        run = mpwatch.load_run(logdir)
        pm = run.probe_model
        cols = [c for c in ("step", "batch_size", "batch_sub_of", "memory_need_bytes",
                            "memory_need_from") if c in pm]
        out["probes"] = pm[cols].to_dict("records") if len(pm) else []
        out["probe_memory"] = [(s, p.get("memory")) for s, p in run.records.get("probe", [])]
        decisions = []
        for b in run.budgets:
            for d in b.get("decisions", []) or []:
                if d.get("action") not in ("ran", "explicit"):
                    decisions.append(d)
        out["budget_not_ran"] = decisions[:20]
        out["notices"] = [n.get("message", n) for n in run.notices][:20]
        sk = run.skipped_steps()
        out["skipped_steps"] = int(sk.iloc[-1]) if len(sk) else 0
        out["own_memory"] = None
        from mpwatch.show.views import memory as show_memory

        out["own_memory"] = show_memory.own_memory(run)
    except Exception as err:  # noqa: BLE001
        out["read_error"] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    return out


def run_child(args: argparse.Namespace, config: str, batch: int) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", config, "--batch", str(batch)]
    for name in ("width", "depth", "in_dim", "steps", "default_steps", "policy"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=FRACTION)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.child_timeout)
    res: dict[str, Any] = {"config": config, "batch": batch, "rc": proc.returncode}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res.update(json.loads(line[7:]))
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0 or "finished" not in res:
        res["stderr_tail"] = proc.stderr[-1500:]
    limit = res.get("physical_bytes") or res.get("bytes_limit")
    if res.get("peak_bytes_in_use") and limit:
        res["peak_share"] = round(res["peak_bytes_in_use"] / limit, 4)
    gib = (res.get("peak_bytes_in_use") or 0) / 2**30
    print(f"  {config:9s} batch {batch:>9,}  rc {res['rc']}  finished {res.get('finished')}  "
          f"peak {gib:7.2f} GiB ({res.get('peak_share')} of the device)  {res['wall_s']} s",
          flush=True)
    if res.get("error"):
        print("    error:", res["error"][:300], flush=True)
    return res


def driver(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"args": vars(args), "fits": []}
    b1, b2 = args.calib
    p1 = run_child(args, "plain", b1)
    p2 = run_child(args, "plain", b2)
    out["fits"] += [p1, p2]
    limit = p2.get("physical_bytes") or p2.get("bytes_limit")
    if not (p1.get("peak_bytes_in_use") and p2.get("peak_bytes_in_use") and limit):
        out["error"] = "no peak figures from the calibration fits"
        return out
    slope = (p2["peak_bytes_in_use"] - p1["peak_bytes_in_use"]) / (b2 - b1)
    batch = int(b2 + (args.target * limit - p2["peak_bytes_in_use"]) / slope)
    batch = max(args.round, batch // args.round * args.round)
    out["slope_bytes_per_example"] = slope
    plain = run_child(args, "plain", batch)
    out["fits"].append(plain)
    share = plain.get("peak_share") or 0
    if not plain.get("finished"):  # the line overshot: nine tenths of it
        batch = max(args.round, int(batch * 0.9) // args.round * args.round)
        plain = run_child(args, "plain", batch)
        out["fits"].append(plain)
    elif not 0.80 <= share <= 0.90:  # once more, from this point
        batch = int(batch + (args.target * limit - plain["peak_bytes_in_use"]) / slope)
        batch = max(args.round, batch // args.round * args.round)
        plain = run_child(args, "plain", batch)
        out["fits"].append(plain)
    out["batch"] = batch
    for config in ("defaults", "probes"):
        out["fits"].append(run_child(args, config, batch))
    probes = out["fits"][-1]
    if probes.get("peak_bytes_in_use") and plain.get("peak_bytes_in_use"):
        out["probe_added_bytes"] = probes["peak_bytes_in_use"] - plain["peak_bytes_in_use"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=float, default=0.85, help="peak share of the device")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--in-dim", type=int, default=64)
    ap.add_argument("--policy", default="mixed_float16")
    ap.add_argument("--steps", type=int, default=6, help="steps of the plain and probes fits")
    ap.add_argument("--default-steps", type=int, default=52, help="steps of the defaults fit")
    ap.add_argument("--calib", type=lambda s: [int(v) for v in s.split(",")],
                    default=[65536, 131072])
    ap.add_argument("--round", type=int, default=1024)
    ap.add_argument("--child-timeout", type=int, default=240)
    ap.add_argument("--json")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="a tiny run of the whole pipeline on a CPU (no device memory to fill)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.child:
        print("RESULT " + json.dumps(child(args), default=str), flush=True)
        return 0
    if args.cpu_smoke:
        args.width, args.depth, args.steps, args.default_steps = 64, 3, 4, 6
        args.round, args.calib = 64, [512, 1024]
        os.environ["MPWATCH_DEVICE_FREE_BYTES"] = str(3 * 2**20)
        plain = run_child(args, "plain", 1024)
        res = {"args": vars(args), "fits": [plain, run_child(args, "probes", 1024)]}
    else:
        res = driver(args)
    text = json.dumps(res, indent=1, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    fits = res["fits"]
    print("batch", res.get("batch"), "probe added", res.get("probe_added_bytes"))
    for f in fits:
        if f.get("config") != "plain":
            print(f"  {f['config']}: {json.dumps(f.get('mpwatch'), default=str)[:1500]}")
    return 0 if all(f.get("finished") for f in fits) else 1


if __name__ == "__main__":
    sys.exit(main())
