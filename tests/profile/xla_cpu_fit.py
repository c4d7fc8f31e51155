"""A short mixed_float16 fit whose train step XLA runs on the CPU, profiled by mpwatch.

Run as ``python tests/profile/xla_cpu_fit.py OUT_DIR`` with ``KERAS_BACKEND=tensorflow`` (a small
CNN compiled with ``jit_compile=True``) or ``KERAS_BACKEND=jax`` (a small ViT: patch convolution,
a self-attention block of Dense layers, an MLP), for ``tests/profile/test_hlo_cpu_truth.py``.
Writes ``OUT_DIR/logs`` (``MixedPrecisionMonitor`` with the profile of batches 3-5) and
``OUT_DIR/facts.json`` (the backend, the layers' names and the monitor's profile error).
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import mpwatch


class Attention(keras.layers.Layer):
    """Single-head self-attention from three Dense layers (Keras' MultiHeadAttention asks JAX's
    CPU dot for an F16_F16_F32 precision it does not support)."""

    def build(self, shape):  # noqa: ANN001, ANN201
        self.q = keras.layers.Dense(32, name="q")
        self.k = keras.layers.Dense(32, name="k")
        self.v = keras.layers.Dense(32, name="v")

    def call(self, x):  # noqa: ANN001, ANN201
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = keras.ops.matmul(q, keras.ops.transpose(k, (0, 2, 1))) / 5.66
        return keras.ops.matmul(keras.ops.softmax(scores, axis=-1), v)


def cnn() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, dtype="float32"),
        ],
        name="net",
    )


def vit() -> keras.Model:
    inp = keras.Input((16, 16, 3))
    p = keras.layers.Conv2D(32, 4, strides=4, name="patches")(inp)
    p = keras.layers.Reshape((16, 32))(p)
    a = keras.layers.LayerNormalization()(p)
    p = keras.layers.Add()([p, Attention(name="attn")(a)])
    f = keras.layers.Dense(64, activation="gelu", name="mlp1")(p)
    p = keras.layers.Add()([p, keras.layers.Dense(32, name="mlp2")(f)])
    p = keras.layers.GlobalAveragePooling1D()(p)
    return keras.Model(inp, keras.layers.Dense(10, dtype="float32", name="head")(p), name="vit")


def main(out: str) -> None:
    backend = keras.backend.backend()
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = vit() if backend == "jax" else cnn()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss, jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.random((8 * 32, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, 8 * 32)
    monitor = mpwatch.MixedPrecisionMonitor(os.path.join(out, "logs"), probe=False, profile=(3, 5))
    model.fit(x, y, batch_size=32, epochs=1, callbacks=[monitor], verbose=0)
    profiler = next(p for p in monitor.parts if isinstance(p, mpwatch.ProfileMonitor))
    facts = {
        "backend": backend,
        "layers": sorted({layer.name for layer in model._flatten_layers()}),
        "error": profiler.error,
    }
    with open(os.path.join(out, "facts.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(sys.argv[1])
