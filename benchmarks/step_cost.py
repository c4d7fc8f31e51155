"""Per-step cost of mpwatch's in-graph tap on Keras' JAX backend: the train step as XLA runs it.

A steady epoch of a monitored fit runs Keras' jitted train step with the tap in it (ring
buffers, the loss scale and skip per batch, the input's health, the gradient counts every
``grad_every`` steps under a ``lax.cond``), plus mpwatch's host work at the batch ends (its
own time, in the budget's ledger: a few ms a fit). Whole fits on a shared 2-core machine move by
several percent from one fit to the next (benchmarks/whole_fit.py's ``steady`` column); this
script measures the train step alone, as one run of XLA's program, in one process:

1. per model, a plain model and one per variant (``plain``: a second plain one, a control
   whose ratio shows the machine's noise) (``--variants``: the monitor's keyword
   arguments; ``defaults`` is ``MixedPrecisionMonitor(log_dir)``), built the same way (seed 0);
   each variant's model runs a 1-batch monitored fit whose batch end takes Keras' state as the
   tap made it (the tap's buffers in it) and compiles ``jax.jit(model.train_step,
   donate_argnums=0)`` on it: the program Keras runs in that fit. The plain one likewise,
   without a monitor;
2. ``--rounds`` rounds, each running every program ``--per`` steps in turn (the order reversed
   every other round), each step timed alone (``block_until_ready``), with its CPU time and the
   process' minor page faults (XLA:CPU maps its temporary memory afresh at every run: a page
   touched is a fault), on one fixed batch, the state carried from step to step (donated, as
   Keras does). The counts steps (every ``grad_every`` steps of the tap's own count) fall where
   they fall: the mean includes them, the median does not;
3. per program: XLA's temporary memory (``memory_analysis``), compile seconds, median and mean
   step time, the ratio to plain of both, the median of the per-round ratios with their range,
   the CPU-time ratio, and page faults per step.

Goal (issue 27): steady steps <= 1.03x of plain.

    python benchmarks/step_cost.py --models app:InceptionV3
    python benchmarks/step_cost.py --models mobilenetv2,transformer --batch-size 8 \
        --variants "defaults;gradient_health=False"
    python benchmarks/step_cost.py --models app:DenseNet121 --policy mixed_bfloat16
"""

from __future__ import annotations

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"  # the tap measured here is the JAX one
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPWATCH_BUDGET", "off")  # the tap is what is measured, not the budget

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def whole_fit() -> Any:
    """benchmarks/whole_fit.py (its model builders and data: the same models, the same way)."""
    spec = importlib.util.spec_from_file_location("mpwatch_bench_whole_fit", f"{HERE}/whole_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_variants(text: str, parse_kwargs: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        out[item] = None if item == "plain" else {} if item == "defaults" else parse_kwargs(item)
    return out


class Program:
    """One compiled train step and the state it carries from step to step."""

    def __init__(self, label: str, model: Any, batch: Any) -> None:
        import jax
        import jax.numpy as jnp

        state = model._get_jax_state(
            trainable_variables=True,
            non_trainable_variables=True,
            optimizer_variables=True,
            metrics_variables=True,
        )
        # copies: the fit this was taken in may still donate the arrays it holds
        self.state = jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), state)
        self.batch = batch
        t0 = time.perf_counter()
        self.run = jax.jit(model.train_step, donate_argnums=0).lower(self.state, batch).compile()
        self.compile_s = time.perf_counter() - t0
        self.temp_mb = self.run.memory_analysis().temp_size_in_bytes / 1e6
        self.label = label
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.faults: list[int] = []
        self.rounds: list[float] = []  # median step of each round

    def steps(self, n: int, keep: bool = True) -> None:
        import jax

        walls = []
        for _ in range(n):
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            _, self.state = out = self.run(self.state, self.batch)
            jax.block_until_ready(out)
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            if keep:
                walls.append(t1 - t0)
                self.cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
                self.faults.append(r1.ru_minflt - r0.ru_minflt)
        if keep:
            self.wall.extend(walls)
            self.rounds.append(statistics.median(walls))


def _take_class() -> Any:
    import keras

    class Take(keras.callbacks.Callback):
        def __init__(self, label: str, model: Any, batch: Any) -> None:
            super().__init__()
            self.label, self.fitted, self.batch = label, model, batch
            self.taken: list[Program] = []

        def on_train_batch_end(self, batch_index: int, logs: Any = None) -> None:
            if not self.taken:  # the state as the tap made it, in the fit it made it for
                self.taken.append(Program(self.label, self.fitted, self.batch))

    return Take


def programs(name: str, args: argparse.Namespace, wf: Any, rm: Any, root: str) -> list[Program]:
    import jax.numpy as jnp

    import mpwatch

    x, y = wf.make_data(name, rm, args.batch_size)
    x, y = x[: args.batch_size], y[: args.batch_size]
    batch = (jnp.asarray(x), jnp.asarray(y), None)
    out = []
    Take = _take_class()
    variants = [(label, kwargs) for label, kwargs in args.variants.items() if label != "plain"]
    if "plain" in args.variants:  # a second plain program: the noise floor of the ratios
        variants.insert(0, ("plain (control)", None))
    for label, kwargs in [("plain", None), *variants]:
        model = wf.build(name, rm, args)
        model.optimizer.build(model.trainable_variables)
        if kwargs is None:  # Keras' train step as a plain fit traces it (its variables purged
            out.append(Program(label, model, batch))  # in a fit: taken before one)
            report(name, out[-1])
            continue
        log_dir = os.path.join(root, f"{len(out)}")
        monitor = mpwatch.MixedPrecisionMonitor(
            log_dir, **{"probe": False, "profile": False, **kwargs}
        )
        model.fit(
            x,
            y,
            batch_size=args.batch_size,
            epochs=1,
            verbose=0,
            callbacks=[monitor, take := Take(label, model, batch)],
        )
        out.append(take.taken[0])
        report(name, out[-1])
    return out


def report(name: str, p: Program) -> None:
    print(
        f"  {name} {p.label}: compiled in {p.compile_s:.1f} s, XLA temporary memory "
        f"{p.temp_mb:.1f} MB",
        file=sys.stderr,
        flush=True,
    )


def measure(name: str, args: argparse.Namespace, wf: Any, rm: Any) -> list[list[str]]:
    import keras

    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(args.policy)
    root = tempfile.mkdtemp(prefix="mpwatch_step_cost_")
    try:
        progs = programs(name, args, wf, rm, root)
        for p in progs:  # warm: the first runs of a program page in its code
            p.steps(3, keep=False)
        for r in range(args.rounds):
            for p in progs if r % 2 == 0 else progs[::-1]:
                p.steps(args.per)
            print(f"  {name}: round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = progs[0]
    med, mean = statistics.median, statistics.fmean
    rows = []
    for p in progs:
        per_round = [a / b for a, b in zip(p.rounds, base.rounds)]
        rows.append(
            [
                name,
                p.label,
                f"{p.temp_mb:.1f}",
                f"{p.compile_s:.1f}",
                f"{1000 * med(p.wall):.1f}",
                f"{med(p.wall) / med(base.wall):.3f}",
                f"{med(per_round):.3f} ({min(per_round):.3f}..{max(per_round):.3f})",
                f"{mean(p.wall) / mean(base.wall):.3f}",
                f"{med(p.cpu) / med(base.cpu):.3f}",
                f"{med(p.faults):.0f}",
                "" if p is base else ("met" if med(per_round) <= 1.03 else "MISSED"),
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="app:InceptionV3", help="as benchmarks/whole_fit.py")
    ap.add_argument("--policy", default="mixed_float16")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per", type=int, default=12, help="steps of each program per round")
    ap.add_argument(
        "--variants", default="defaults",
        help='monitor keyword arguments per variant, ";"-separated: "defaults;input_health=False"; '
        '"plain": a second plain program, the noise floor',
    )  # fmt: skip
    ap.add_argument("--huge-layers", type=int, default=1000)
    args = ap.parse_args(argv)
    wf = whole_fit()
    rm = wf.real_models()
    args.variants = parse_variants(args.variants, wf.parse_kwargs)
    args.prebuild = True
    import jax

    rows = []
    for name in filter(None, args.models.split(",")):
        rows.extend(measure(name, args, wf, rm))
    print(
        f"\ntrain step alone, monitored / plain, JAX on {jax.default_backend()}, {args.policy}, "
        f"batch {args.batch_size}, {args.rounds} rounds x {args.per} steps per program"
    )
    head = ["model", "variant", "XLA temp MB", "compile s", "step ms", "median ratio",
            "per round (min..max)", "mean ratio", "cpu ratio", "faults/step",
            "<= 1.03"]  # fmt: skip
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
