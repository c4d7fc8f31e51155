"""Trains examples/more_models.py's models under Keras' JAX backend, for test_more_models.py.

Run as ``KERAS_BACKEND=jax python tests/realmodels/more_models_jax.py OUT_DIR [NAME[:fixed] ...]``
(Keras fixes its backend at import: the TensorFlow test session runs this in its own process).
Each model is trained by the example's ``train`` into ``OUT_DIR/NAME`` (``NAME_fixed``: with its
fix, and without mpwatch's probe) with an independent observer callback beside mpwatch's monitor
that reads the optimizer's own state after every batch (``model.jax_state_sync()``, then
``iterations`` and ``dynamic_scale``). Writes ``OUT_DIR/truth.json``: per run, the batches run,
the optimizer's iterations and scale after each, whether it is a LossScaleOptimizer, the output
layer's name, class, compute dtype and activation, max |g| of the float32 reference's
gradients on the probe's batch (``ref_max_grad``), the dtype of the model's output on two
samples, every layer's compute dtype, how many layers of each class it has, and the seconds the
run took; and, before the fit, the pre-flight of the model as the fit builds it
(``preflight``: its verdict, predictions and change).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import keras
import numpy as np

assert keras.backend.backend() == "jax", keras.backend.backend()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repo_scripts import load_script  # noqa: E402

import mpwatch  # noqa: E402


class Observer(keras.callbacks.Callback):
    """After each batch: the optimizer's own iterations and loss scale (the truth)."""

    def __init__(self):
        super().__init__()
        self.iterations, self.scale = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.model.jax_state_sync()
        opt = self.model.optimizer
        self.iterations.append(int(np.asarray(opt.iterations)))
        scale = getattr(opt, "dynamic_scale", None)
        self.scale.append(None if scale is None else float(np.asarray(scale)))


def reference_max_grad(mm, name, model):
    """max |g| of the float32 reference's gradients, by hand: a float32 twin with the model's
    final weights (its last probe's), on the probe's batch (the first), training mode, Dropout
    off, the compiled loss unscaled, through ``jax.grad`` of ``stateless_call``."""
    import jax

    twin, x, y = mm.build(name, policy="float32")
    twin.set_weights(model.get_weights())
    b = mm.BATCH_SIZES[name]
    xb, yb = x[:b], y[:b]
    for layer in twin._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    ntv = [v.value for v in twin.non_trainable_variables]

    def loss(tv):
        y_pred, _ = twin.stateless_call(tv, ntv, xb, training=True)
        return keras.losses.sparse_categorical_crossentropy(yb, y_pred).mean()

    grads = jax.grad(loss)([v.value for v in twin.trainable_variables])
    return max(float(np.abs(np.asarray(g)).max()) for g in grads)


def preflight_of(mm, name, out):
    """The pre-flight of the model as its fit builds it (the same seed: the fit's first weights),
    on the fit's first batch, under the fit's policy, before the fit: its verdict, predictions,
    change and the checked change's predictions."""
    keras.backend.clear_session()
    model, x, y = mm.build(name)
    b = mm.BATCH_SIZES[name]
    report = mpwatch.preflight(model, (x[:b], y[:b]), policies=(mm.POLICIES[name],),
                               log_dir=os.path.join(out, name + "_preflight"))  # fmt: skip
    (c,) = report.candidates
    return {
        "verdict": c.verdict,
        "reason": c.reason,
        "predictions": c.predictions,
        "problems": [f.rule for f in c.problems],
        "fix_layers": list(c.fix.float32_layers),
        "checked": None if c.checked is None else c.checked.predictions,
        "checked_problems": None if c.checked is None else [f.rule for f in c.checked.problems],
        "recommended": report.recommended,
        "seconds": sum(report.seconds.values()),
    }


def run_one(mm, name, fixed, out):
    pre = None if fixed else preflight_of(mm, name, out)
    t0 = time.perf_counter()
    observer = Observer()
    logdir = os.path.join(out, name + ("_fixed" if fixed else ""))
    # a fixed model is trained to see its output and its findings: without the probe (whose
    # compiled passes cost as much as the fit's own on a CPU)
    extra = {"probe": False} if fixed else {}
    keras.backend.clear_session()  # names as in a fresh process: a fresh build's
    model, history = mm.train(name, logdir, fixed=fixed, callbacks=[observer], **extra)
    x, _ = mm.data(name)
    layer = mm.output_layer(model)
    with mm.policy_scope(mm.POLICIES[name]):
        y = model(x[:2])
    return {
        "logdir": logdir,
        "batches": len(observer.iterations),
        "iterations": observer.iterations,
        "scale": observer.scale,
        "loss_scale_optimizer": isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer),
        "output_layer": layer.name,
        "output_class": type(layer).__name__,
        "output_compute_dtype": layer.compute_dtype,
        "output_activation": getattr(getattr(layer, "activation", None), "__name__", None),
        "output_dtype": str(y.dtype),
        "compute_dtypes": sorted({ly.compute_dtype for ly in model._flatten_layers()}),
        "classes": dict(Counter(type(ly).__name__ for ly in model._flatten_layers())),
        "loss": history.history["loss"],
        "ref_max_grad": None
        if fixed or name == "mobilenet_v2_bf16"
        else reference_max_grad(mm, name, model),
        "fixes": [] if fixed else fixes_alike(mm, name, logdir),
        "preflight": pre,
        "seconds": time.perf_counter() - t0,
    }


#: findings of the model's structure (a layer's dtype, the device): a short fit shows them gone
STRUCTURAL = {"output-16bit", "no-tensor-cores"}


def fixes_alike(mm, name, logdir):
    """Each model-changing finding of the run: printed and applied alike (printed_fix asserts
    it), and each retrained (1 step without a probe, for a finding of the model's structure: it
    shows in the layers' record): the findings that are it again, by title (none: gone)."""
    from printed_fix import every_fix_alike

    def retrain(model, f, label):
        short = {"steps": 1, "probe": False, "log_every": 1} if f.rule in STRUCTURAL else {}
        mm.train(name, f"{logdir}_{label}", model=model, **short)
        return f"{logdir}_{label}"

    return every_fix_alike(mpwatch.diagnose(logdir), lambda p: mm.build(name, policy=p)[0], retrain)


def main(out, specs):
    mm = load_script("examples/more_models.py")
    truth = {}
    for spec in specs:
        name, _, flag = spec.partition(":")
        truth[spec] = run_one(mm, name, flag == "fixed", out)
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["vit", "mobilenet_v2_bf16"])
