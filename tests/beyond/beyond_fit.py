"""Trains keras.io's "Text classification with Transformer" with mpwatch, for tests/beyond/.

Run as ``KERAS_BACKEND=tensorflow|jax python tests/beyond/beyond_fit.py OUT_DIR`` (Keras fixes
its backend at import: each backend runs in its own process). Writes one logdir per case under
``OUT_DIR`` and ``OUT_DIR/truth.json``: what the tests compare mpwatch's records with, measured
here without mpwatch's code.

Cases (the model from ``examples/real_models.py``, keras.io's code; its Dropout layers at rate 0
so that this script's own gradients equal the train step's):

- ``bfloat16``: the pure ``bfloat16`` policy (16-bit variables), Adam 1e-3, 12 steps, mpwatch's
  tap every 4 steps. Truth, at each of those steps: every variable's values before and after the
  step (read from the variables, after ``jax_state_sync`` on JAX) and the step's gradients,
  computed here on the same batch and weights (``tf.GradientTape`` / ``jax.grad`` of
  ``model(x, training=True)``'s sparse categorical cross-entropy): per variable, the elements
  with a nonzero finite gradient and, of those, the ones whose value did not change.
- ``sgd``: the pure ``bfloat16`` policy with plain SGD (learning rate 0.01): some updates are
  below half a unit in the last place of their weight, some are not (the same truth). (Pure
  float16 does not run on JAX's CPU backend: its float16 dot with float32 accumulation is not
  supported there.)
- ``mixed``: ``mixed_bfloat16`` (float32 variables, the fix): no variable is 16-bit; the truth
  counts the float32 variables' unchanged elements the same way. mpwatch probes every 4 steps
  (on the first training batch); after the first probe the truth has, per Dense/EinsumDense layer,
  the errors Keras' own float8 copy of it makes on that batch (``float8_truth.py``).
Every case's truth also has the model's variables' sizes and dtypes (trainable, all, and the
optimizer's), the batch size, and the leaf layers' output sizes for one batch.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import mpwatch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from tests.beyond.float8_truth import float8_truth  # noqa: E402
from tests.repo_scripts import load_script  # noqa: E402

BACKEND = keras.backend.backend()
EVERY, STEPS, BATCH = 4, 12, 16


def _values(variables):
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]


def _gradients(model, x, y):
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        return [np.array(tf.convert_to_tensor(g)) if g is not None else None for g in grads]
    import jax

    tvs = [v.value for v in model.trainable_variables]
    ntvs = [v.value for v in model.non_trainable_variables]

    def loss_of(tvs):
        y_pred, _ = model.stateless_call(tvs, ntvs, x, training=True)
        return loss_fn(y, y_pred)

    return [np.array(g) for g in jax.grad(loss_of)(tvs)]


class Truth(keras.callbacks.Callback):
    """Before and after every EVERY-th step: the variables' values and the step's gradients; with
    ``float8`` (a function of the model), its value after the first probe's step (mpwatch's
    probe ran there first, on the first training batch, and measured float8 readiness: its
    first probe does)."""

    def __init__(self, x, y, float8=None):
        super().__init__()
        self.x, self.y, self.rows, self._before = x, y, {}, None
        self.float8, self.float8_truth = float8, None

    def _sync(self):
        if BACKEND == "jax" and getattr(self.model, "_jax_state", None):
            self.model.jax_state_sync()

    def on_train_batch_begin(self, batch, logs=None):
        step = batch + 1
        if step % EVERY:
            return
        self._sync()
        x, y = self.x[batch * BATCH : step * BATCH], self.y[batch * BATCH : step * BATCH]
        tvs = self.model.trainable_variables
        self._before = (_values(tvs), _gradients(self.model, x, y))

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if step % EVERY or self._before is None:
            return
        self._sync()
        tvs = self.model.trainable_variables
        after = _values(tvs)
        before, grads = self._before
        rows = {}
        for v, b, a, g in zip(tvs, before, after, grads):
            if g is None:
                continue
            moved = (g != 0) & np.isfinite(g)
            rows[v.path] = [int(moved.sum()), int((moved & (a == b)).sum())]
        self.rows[str(step)] = rows
        self._before = None
        if self.float8 is not None and step == EVERY:
            self.float8_truth = self.float8(self.model)


def _activations(model, x):
    """Elements and dtype of every leaf layer's outputs for one batch, from an eager call of the
    model with each leaf layer's ``call`` wrapped here: {dtype: elements}."""
    found = {}
    leaves = [
        layer for layer in model._flatten_layers(include_self=False, recursive=True)
        if not list(layer._flatten_layers(include_self=False, recursive=False))
    ]  # fmt: skip
    for layer in leaves:
        orig = layer.call

        def call(*args, __orig=orig, **kwargs):
            out = __orig(*args, **kwargs)
            for t in keras.tree.flatten(out):
                dtype = keras.backend.standardize_dtype(t.dtype)
                found[dtype] = found.get(dtype, 0) + int(np.prod(t.shape))
            return out

        layer.call = call
    try:
        model(x, training=True)
    finally:
        for layer in leaves:
            del layer.call
    return found


def _sizes(variables):
    return [[v.path, str(v.dtype), int(np.prod(v.shape))] for v in variables]


def _no_dropout(model):
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    return model


def _case(out, name, policy, sgd=False, probe=False):
    real = load_script("examples/real_models.py")
    with real.policy_scope(policy):
        model, x, y = real.build_transformer(seed=0, n=STEPS * BATCH)
        if sgd:
            model.compile(optimizer=keras.optimizers.SGD(0.01),
                          loss="sparse_categorical_crossentropy")  # fmt: skip
    _no_dropout(model)

    def float8(model):
        def build32():
            with real.policy_scope("float32"):
                return _no_dropout(real.build_transformer(seed=0, n=BATCH)[0])

        return float8_truth(model, build32, x[:BATCH], y[:BATCH])

    truth = Truth(x, y, float8 if probe else None)
    monitor = mpwatch.MixedPrecisionMonitor(
        log_dir=os.path.join(out, name), log_every=EVERY, probe_every=EVERY if probe else None,
        profile=False, budget=None,
    )  # fmt: skip
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[monitor, truth])  # fmt: skip
    opt = model.optimizer
    optimizer = list(opt.variables)
    inner = getattr(opt, "inner_optimizer", None)
    if inner is not None:
        optimizer += [v for v in inner.variables if all(v is not o for o in optimizer)]
    return {
        "policy": policy,
        "updates": truth.rows,
        "trainable": _sizes(model.trainable_variables),
        "variables": _sizes(model.variables),
        "optimizer": _sizes(optimizer),
        "batch_size": BATCH,
        "activations": _activations(model, x[:BATCH]),
        "float8": truth.float8_truth,
    }


def main(out):
    truth = {
        "backend": BACKEND,
        "bfloat16": _case(out, "bfloat16", "bfloat16"),
        "sgd": _case(out, "sgd", "bfloat16", sgd=True),
        "mixed": _case(out, "mixed", "mixed_bfloat16", probe=True),
    }
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
