"""The probe's XLA program on the issue's wide MLP (Dense 4096, 4096, 1024, 10 on 4096 inputs,
37.8M parameters): its memory analysis beside the model's float32 weights, written to OUT/truth.json
(run by tests/record/test_probe_memory.py in its own process, under KERAS_BACKEND=jax)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ["MPWATCH_CACHE_DIR"] = "off"

import keras  # noqa: E402
import numpy as np  # noqa: E402

from mpwatch.record.probe.probe import Probe  # noqa: E402


def main(out: str) -> None:
    truth = {}
    for policy in ("mixed_bfloat16", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        model = keras.Sequential(
            [keras.Input((4096,))]
            + [keras.layers.Dense(4096, activation="relu") for _ in range(2)]
            + [keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10, dtype="float32")]
        )
        model.compile("adam", "mse")
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(4, 4096)).astype("float32"), rng.normal(size=(4, 10))
        probe = Probe(model)
        memory = probe.memory((x, y.astype("float32")))
        weights = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
        analysis = probe._fn.memory_analysis(x, y.astype("float32"), None)
        truth[policy] = {
            "weights": weights,
            "temp": int(analysis.temp_size_in_bytes),
            "need": memory["need_bytes"],
            "need_from": memory["need_from"],
        }
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
