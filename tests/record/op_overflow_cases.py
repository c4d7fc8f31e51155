"""Layers whose float16 ops overflow inside them, run op by op by
mpwatch/record/probe/op_overflow.py, for tests/record/test_op_overflow.py. Run as
``KERAS_BACKEND=<backend> python tests/record/op_overflow_cases.py OUT_DIR``; writes
``OUT_DIR/truth.json``: each case's result and the line of this file its overflowing op is written
on."""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np
from keras import ops

from mpwatch.record.probe.op_overflow import first_overflow

LINES = {}


class RMSNorm(keras.layers.Layer):
    def call(self, x):
        ms = ops.mean(ops.square(x), axis=-1, keepdims=True)  # overflows past |x| = 256
        return x * ops.rsqrt(ms + 1e-6)


class SoftGate(keras.layers.Layer):
    def call(self, x):
        return x / (1.0 + ops.exp(x))  # exp overflows past x = 11.1; x / inf = 0


def main(out):
    src = open(__file__).read().splitlines()
    lines = {name: i + 1 for i, ln in enumerate(src) for name in ("square", "exp")
             if f"ops.{name}(x)" in ln and "def " not in ln}  # fmt: skip
    cases = {
        "rms_300": (RMSNorm(dtype="mixed_float16"), np.full((2, 8), 300.0, "float16")),
        "rms_10": (RMSNorm(dtype="mixed_float16"), np.full((2, 8), 10.0, "float16")),
        "gate_20": (SoftGate(dtype="mixed_float16"), np.full((2, 8), 20.0, "float16")),
        "rms_300_float32": (RMSNorm(dtype="float32"), np.full((2, 8), 300.0, "float32")),
    }
    truth = {"lines": lines, "results": {}}
    for name, (layer, x) in cases.items():
        truth["results"][name] = first_overflow(layer, keras.ops.convert_to_tensor(x))
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
