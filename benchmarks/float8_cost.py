"""What float8 readiness adds to a probe: the probe's time with and without it, in one run.

For each model (keras.io's Transformer classifier; ``keras.applications.ConvNeXtTiny`` with
``weights=None`` at 32x32, whose blocks hold Dense layers), under ``mixed_bfloat16``, on the
first batch: one probe to compile (not timed), then ``--reps`` probes with float8 readiness and
as many without, interleaved, and the median of each. Printed: the layers measured, both medians,
their difference (float8's own cost), the ratio, and float8's cost per probe on average (a fit
measures it at its first probe and every ``FLOAT8_EVERY``-th after). The cost budget
(:mod:`mpwatch.record.runtime.budget`) schedules probes by their measured cost, float8 included.

    KERAS_BACKEND=tensorflow python benchmarks/float8_cost.py [--models transformer convnext]
        [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _transformer():
    from tests.repo_scripts import load_script

    real = load_script("examples/real_models.py")
    model, x, y = real.build_transformer(seed=0, n=32)
    return model, x[:16], y[:16]


def _convnext():
    import keras
    import numpy as np

    model = keras.applications.ConvNeXtTiny(
        weights=None, input_shape=(32, 32, 3), classes=10, include_preprocessing=False
    )
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.random((16, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 16)
    return model, x, y


MODELS = {"transformer": _transformer, "convnext": _convnext}


def measure(name: str, reps: int) -> dict:
    import keras

    from mpwatch.record.probe import float8_capture
    from mpwatch.record.probe.probe import Probe

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model, x, y = MODELS[name]()
        model.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
        probe = Probe(model)
        probe.run((x, y))  # compile
        times = {True: [], False: []}
        for _ in range(reps):
            for on in (True, False):
                probe.float8 = on
                probe._float8_runs = 0  # as at a fit's first probe: it measures float8
                t0 = time.perf_counter()
                payload = probe.run((x, y))
                times[on].append(time.perf_counter() - t0)
                assert ("float8" in payload) == on
        return {
            "layers": len(float8_capture.eligible_layers(model)),
            "with": statistics.median(times[True]),
            "without": statistics.median(times[False]),
        }
    finally:
        keras.mixed_precision.set_global_policy("float32")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    import keras

    print(f"backend {keras.backend.backend()}, {args.reps} probes each way, medians")
    from mpwatch.record.probe.probe import FLOAT8_EVERY

    print("| model | Dense/EinsumDense | probe with float8 | without | float8's own | ratio | "
          f"per probe (1 in {FLOAT8_EVERY}) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        m = measure(name, args.reps)
        print(
            f"| {name} | {m['layers']} | {m['with']:.3f} s | {m['without']:.3f} s | "
            f"{m['with'] - m['without']:.3f} s | {m['with'] / m['without']:.2f} | "
            f"{(m['with'] - m['without']) / FLOAT8_EVERY:.3f} s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
