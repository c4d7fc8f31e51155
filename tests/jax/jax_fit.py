"""Trains small models under Keras' JAX backend with mpwatch, for tests/record/test_jax_backend.py.

Run as ``KERAS_BACKEND=jax python tests/jax/jax_fit.py OUT_DIR`` (the backend is fixed when keras
is imported, so the TensorFlow test session runs this in its own process). For each case it
trains a model with :class:`mpwatch.MixedPrecisionMonitor` and, beside it, an independent observer
callback that reads the optimizer's own state after every Keras call (``model.jax_state_sync()``,
then ``dynamic_scale`` and ``iterations``): the ground truth the test compares mpwatch's records
with. Writes ``OUT_DIR/truth.json`` and one logdir per case under ``OUT_DIR``.

Cases: ``forced`` (a Dense network under mixed_float16 whose inputs are scaled up 1e4x on chosen
batches, so the float16 forward overflows and Keras skips exactly those updates), with
``steps_per_execution`` 1 and 4 and ``log_every`` 1 and 7; ``softmax`` (a CNN whose float16
softmax output the diagnosis must name); ``probe_known`` (test_probe.py's known model: every scaled
gradient a power of two or zero, so which ones float16 loses is known in numpy); ``probe_bn`` (a
CNN with BatchNormalization and Dropout, probed every step during fit: the probe must measure the
train step's network and change nothing, so its weights equal a plain fit's bit for bit);
``refits`` (fits with, with, without, with mpwatch: the traces of the train step counted, whether
the tap was in them, the loss-scale truth per batch, and the weights against a plain twin's);
``syncs`` (Keras' own state write-backs during monitored fits of 8 and 32 batches);
``select_spe1_every7``/``select_spe4_every7`` and ``apart_spe1_every7``/``apart_spe4_every7``
(``forced`` with the gradient counts computed at every step and selected, or in a second program
run at the count steps only, a GPU's way, instead of under a conditional; each count step waits
for that program); ``apart_late`` (the second program without waiting, counts at every step: the
count steps that ran before it compiled, and the weights against a plain twin's);
``apart_view`` (the same while the training thread holds the probe's float32 view of the model);
``apart_short`` (the same under a cost budget, in a fit too short to compile the program);
``apart_broken`` (the same with the dispatcher's own work made to raise); ``apart_reshaped`` (two
fits of one model with other batch sizes);
``async_spe1``/``async_spe4``
(``forced`` with the monitor alone and Keras' batch ends on its
worker thread); ``async_validation`` (the worker thread, with validation after an epoch of one
call); ``custom_unscaled`` (a custom stateless ``train_step`` that never calls
``scale_loss``); ``unknown_worker``/``unknown_training`` (data of unknown length,
``steps_per_execution`` 4: each epoch's last call runs fewer batches than Keras' indices say);
``raised_worker``/``raised_training`` (a fit that raises, then a whole one, with one
monitor); ``slow_worker``/``slow_training`` (a step that sleeps 30 ms on the device side:
the step time recorded when the host runs ahead of the device, and when it does not);
``compiles`` (the programs XLA compiled in plain and monitored fits, from JAX's own log).
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import mpwatch

assert keras.backend.backend() == "jax", keras.backend.backend()

OVERFLOW_BATCHES = {2, 3, 9, 17}  # 0-based training batches whose inputs overflow float16


class Observer(keras.callbacks.Callback):
    """After each Keras call: the optimizer's own loss scale and iterations (the truth)."""

    def __init__(self):
        super().__init__()
        self.scale, self.iterations = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.model.jax_state_sync()
        self.scale.append(float(self.model.optimizer.dynamic_scale.numpy()))
        self.iterations.append(int(self.model.optimizer.iterations.numpy()))


def forced(logdir, spe, log_every, way=None):
    """``way``: how the tap computes the gradient counts (``JaxTap.counts_way``: "select", at
    every step and selected; "apart", in a second program at the count steps, each waiting for
    that program) instead of under a lax.cond."""
    from mpwatch.record.tap.jax_programs import TwoPrograms
    from mpwatch.record.tap.jax_tap import JaxTap

    JaxTap.counts_way, TwoPrograms.wait_at_count_steps = way, True
    try:
        return _forced(logdir, spe, log_every)
    finally:
        JaxTap.counts_way, TwoPrograms.wait_at_count_steps = None, False


def _apart(logdir, callbacks=(), **monitor_kwargs):
    """``forced``'s model fitted plain, then again with the monitor and the gradient counts in
    their own program (``JaxTap.counts_way`` "apart"), beside ``callbacks`` (each given the
    monitor's programs as ``.programs``, a function): (the programs, whether the weights equal
    the plain fit's bit for bit)."""
    from mpwatch.record.tap.jax_tap import JaxTap

    model, x, y = forced_model()
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    plain = [np.asarray(v).tolist() for v in model.trainable_weights]
    model, x, y = forced_model()
    monitor = mpwatch.MixedPrecisionMonitor(logdir, probe=False, profile=False, **monitor_kwargs)

    def programs():
        return (monitor.state.tap or monitor.state.parked).programs

    for cb in callbacks:
        cb.programs = programs
    JaxTap.counts_way = "apart"
    try:
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[monitor, *callbacks])
    finally:
        JaxTap.counts_way = None
    return programs(), plain == [np.asarray(v).tolist() for v in model.trainable_weights]


class WaitFor(keras.callbacks.Callback):
    """Waits for the counts' program before the batch of index ``batch`` (so that the steps
    after it have their counts whatever this machine's speed)."""

    def __init__(self, batch=11):
        super().__init__()
        self.batch = batch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            self.programs().wait(120.0)


def apart_view(logdir):
    """The gradient counts in their own program (``_apart``, counts at every step), while the
    training thread holds the model's layers switched to float32 (the probe's reference view)
    for 0.5 s from the second step's begin: the counting program, traced on its thread
    meanwhile, must wait for the view to end (a trace inside it would compute the count steps
    in float32). (The switches' lock is taken from the first step's begin, so that the thread,
    started after the first step, meets the view however fast it is.)"""
    import time

    from mpwatch.record.probe.twin import SWITCHING, PolicyView

    seen = {}

    class View(WaitFor):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                SWITCHING.acquire()
            elif batch == 1:
                try:
                    with PolicyView(self.model, "float32"):
                        time.sleep(0.5)
                        seen["ready_in_view"] = self.programs().ready
                finally:
                    SWITCHING.release()
            super().on_train_batch_begin(batch, logs)

    programs, same = _apart(logdir, [View()], log_every=1)
    return {
        "ready_in_view": seen.get("ready_in_view"),
        "missed": list(programs.missed),
        "same_weights": same,
    }


def apart_short(logdir):
    """The gradient counts in their own program (``_apart``, counts at every step) under a cost
    budget: a fit of 24 fast steps after a first step that compiled for a while is too short to
    compile the counts' program beside it, so it never starts (a process exiting while it
    compiled would wait for it)."""
    programs, same = _apart(logdir, log_every=1, budget=0.05)
    return {"started": programs.started, "missed": list(programs.missed), "same_weights": same}


def apart_broken(logdir):
    """The gradient counts in their own program (``_apart``), whose dispatcher fails to take the
    first step's shapes (made to raise here): training goes on with the every-step program, the
    counts are off and said so."""
    from mpwatch.record.tap import jax_programs

    def broken(tree):
        raise RuntimeError("no shapes today")

    original, jax_programs._abstract = jax_programs._abstract, broken
    try:
        programs, same = _apart(logdir, log_every=4)
    finally:
        jax_programs._abstract = original
    return {"failed": programs.failed, "missed": list(programs.missed), "same_weights": same}


def apart_reshaped(logdir):
    """The gradient counts in their own program (counts at every step) over two fits of one
    model, batches of 8 then of 4: the second fit's batches have other shapes, so the counting
    program is compiled again for them (as Keras traces the every-step one again). Each fit waits
    for it before its 12th step (``WaitFor``): the count steps each fit ran without counts."""
    from mpwatch.record.tap.jax_tap import JaxTap

    model, x, y = forced_model()
    fits = []
    JaxTap.counts_way = "apart"
    try:
        for i, batch in enumerate((8, 4)):
            monitor = mpwatch.MixedPrecisionMonitor(os.path.join(logdir, f"fit{i}"), log_every=1,
                                                    probe=False, profile=False)  # fmt: skip
            wait = WaitFor()
            wait.programs = lambda m=monitor: (m.state.tap or m.state.parked).programs
            model.fit(x[:96], y[:96], batch_size=batch, shuffle=False, verbose=0,
                      callbacks=[monitor, wait])  # fmt: skip
            programs = wait.programs()
            fits.append({"missed": list(programs.missed), "count_steps": programs.count_steps,
                         "last": programs.dispatched})  # fmt: skip
    finally:
        JaxTap.counts_way = None
    return fits


def apart_late(logdir):
    """The gradient counts in their own program (``_apart``, counts at every step), which
    compiles on a thread after the first step while training goes on (nothing in mpwatch waits
    for it; a callback waits for it before step 12): the steps the tap says ran without counts."""
    programs, same = _apart(logdir, [WaitFor()], log_every=1)
    return {
        "way": programs.tap.way,
        "missed": list(programs.missed),
        "count_steps": programs.count_steps,
        "compiled": programs.wait(120.0),
        "same_weights": same,
    }


def forced_model(spe=1):
    """``forced``'s model (a Dense network under mixed_float16) and data (24 batches of 8)."""
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(h))
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=spe)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24 * 8, 16)).astype("float32")
    for b in OVERFLOW_BATCHES:
        x[b * 8 : (b + 1) * 8] *= 1e4  # float16 overflows in the first Dense: inf loss
    y = rng.normal(size=(24 * 8, 1)).astype("float32")
    return model, x, y


class DeviceSleep(keras.layers.Layer):
    """Sleeps ``seconds`` on the device side of every step (a host callback in the jitted step)."""

    def __init__(self, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x):
        import time

        import jax

        jax.debug.callback(lambda: time.sleep(self.seconds))
        return x


def _forced(logdir, spe, log_every):
    model, x, y = forced_model(spe)
    observer = Observer()
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=log_every, probe=False, profile=False)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[monitor, observer])
    return {"scale": observer.scale, "iterations": observer.iterations}


def asynchronous(logdir, spe):
    """``forced``'s model and data, watched by the monitor alone with Keras' batch ends on its
    worker thread (``async_batch_end``, the default on a GPU): which threads ran the monitor's
    batch ends, and what Keras chose."""
    import threading

    main, seen = threading.get_ident(), []

    class Watched(mpwatch.MixedPrecisionMonitor):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(threading.get_ident() != main)
            super().on_train_batch_end(batch, logs)

    model, x, y = forced_model(spe)
    monitor = Watched(logdir, log_every=7, probe=False, profile=False)
    monitor.async_batch_end = True
    chosen = keras.callbacks.CallbackList([monitor], model=model)._async_train
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    return {"keras_async": chosen, "on_worker": seen}


def slow_steps(logdir, worker):
    """A model whose every step sleeps 30 ms on the device side (a host callback inside the
    jitted step): the step time mpwatch records, with the batch ends on Keras' worker thread
    (the host runs ahead of the device) or on the training thread, against the sleep and the
    fit's wall time."""
    import time

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(DeviceSleep(0.03)(inp)))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x, y = np.ones((8 * 30, 4), "float32"), np.ones((8 * 30, 1), "float32")
    model.fit(x[:16], y[:16], batch_size=8, verbose=0)  # traced before the timed fit
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=10, probe=False, profile=False)
    monitor.async_batch_end = worker
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[monitor])
    wall = time.perf_counter() - t0
    return {"wall": wall, "steps": 30, "sleep": 0.03, "budget_step": monitor.budget.step_seconds()}


def raised_then_fit(logdir, worker):
    """``forced``'s model and data, one monitor through a fit that raises at its 11th call's
    begin (a callback that Keras lets run with the batch ends on its worker thread) and a second
    whole fit: with the batch ends on the worker thread (``worker``) Keras skips its wait for
    them at the raise, and their notes must not leak into the second fit. The test compares it
    with the same two fits with the batch ends on the training thread."""

    class Interrupt(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 10:
                raise KeyboardInterrupt("a user stopped the fit")

    model, x, y = forced_model()
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=7, probe=False, profile=False)
    monitor.async_batch_end = worker
    fit = dict(batch_size=8, shuffle=False, verbose=0)
    try:
        model.fit(x, y, epochs=1, callbacks=[monitor, Interrupt()], **fit)
    except KeyboardInterrupt:
        pass
    history = model.fit(x, y, epochs=1, callbacks=[monitor], **fit)
    return {"loss": history.history["loss"], "iterations": int(model.optimizer.iterations.numpy())}


def unknown_length(logdir, worker):
    """``forced``'s model with ``steps_per_execution`` 4, fed by a generator of 10 batches (an
    epoch of unknown length: its last call runs 2 batches, though Keras' indices say 4), two
    fits of it; ``worker``: Keras' batch ends on its worker thread, else on the training thread
    beside an observer of each call's loss and the optimizer's iterations (the truth)."""
    model, x, y = forced_model(4)
    clean = [b for b in range(24) if b not in OVERFLOW_BATCHES][-10:]  # no step skipped

    def batches():
        for b in clean:
            yield x[8 * b : 8 * (b + 1)], y[8 * b : 8 * (b + 1)]

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_train_batch_end(self, batch, logs=None):
            self.model.jax_state_sync()
            iterations = int(self.model.optimizer.iterations.numpy())
            self.calls.append((iterations, float(logs["loss"])))

    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=5, probe=False, profile=False)
    monitor.async_batch_end = worker
    losses = Losses()
    callbacks = [monitor] if worker else [monitor, losses]
    for _ in range(2):
        model.fit(batches(), epochs=1, verbose=0, callbacks=callbacks)
    return {"calls": losses.calls, "iterations": int(model.optimizer.iterations.numpy())}


def custom_unscaled(logdir):
    """``forced``'s model as keras.io's JAX guide writes a custom stateless ``train_step``
    ("Customizing what happens in fit() with JAX"): it never calls ``optimizer.scale_loss``."""
    import jax

    class Custom(keras.Model):
        def compute_loss_and_updates(self, tv, ntv, x, y, training=False):
            y_pred, ntv = self.stateless_call(tv, ntv, x, training=training)
            return self.compute_loss(x, y, y_pred), (y_pred, ntv)

        def train_step(self, state, data):
            tv, ntv, ov, mv = state
            x, y = data
            grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
            (loss, (_, ntv)), grads = grad_fn(tv, ntv, x, y, training=True)
            tv, ov = self.optimizer.stateless_apply(ov, grads, tv)
            return {"loss": loss}, (tv, ntv, ov, mv)

    plain, x, y = forced_model()
    model = Custom(plain.inputs, plain.outputs)
    model.compile(keras.optimizers.SGD(0.01), "mse")
    clean = [b for b in range(24) if b not in OVERFLOW_BATCHES]
    x, y = x.reshape(24, 8, 16)[clean].reshape(-1, 16), y.reshape(24, 8, 1)[clean].reshape(-1, 1)
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=5, probe=False, profile=False)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    return {"iterations": int(model.optimizer.iterations.numpy())}


def async_validation(logdir):
    """Keras' worker thread with validation after each epoch of one call (3 batches of 8, one
    ``steps_per_execution`` call) whose step sleeps 100 ms on the device side: the host reaches
    the validation before the worker has noted the call. The call's work (the layer tracer's
    record of the training batch, then its removal) must be done before the validation (batches
    of 5) runs. Truth: the training batch size, and the fit's own logs."""
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(DeviceSleep(0.1)(inp))
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(h))
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=3)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 16)).astype("float32"), rng.normal(size=(24, 1)).astype("float32")
    vx, vy = rng.normal(size=(10, 16)).astype("float32"), rng.normal(size=(10, 1)).astype("float32")
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=3, probe=False, profile=False)
    monitor.async_batch_end = True
    history = model.fit(
        x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[monitor],
        validation_data=(vx, vy), validation_batch_size=5,
    )  # fmt: skip
    return {"batch_size": 8, "val_loss": history.history["val_loss"]}


def softmax(logdir):
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4, activation="softmax", name="probs"),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 12, 12, 1)).astype("float32")
    y = rng.integers(0, 4, 64)
    monitor = mpwatch.MixedPrecisionMonitor(logdir, log_every=2, profile=False)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[monitor])
    return {"variables": [v.path for v in model.trainable_variables]}


# test_probe.py's known model (its docstring: every scaled product a power of two or zero)
X = np.array([[2.0**-4, 0.0, 2.0**-12, 1.0, 2.0**-8]], np.float32)
C = np.array([[2.0**-40, 2.0**-12, 2.0**-22, 2.0**-30]], np.float32)
KERNEL = np.ones((5, 4), np.float32)
KERNEL[:, 2] = -1.0  # a dead ReLU unit
KNOWN_SCALE = 2.0**10


def sum_loss(y_true, y_pred):
    return keras.ops.sum(keras.ops.cast(y_pred, "float32") * C)


def probe_known(logdir):
    keras.mixed_precision.set_global_policy("mixed_float16")
    layer = keras.layers.Dense(4, use_bias=False, activation="relu", name="known")
    model = keras.Sequential([keras.Input((5,)), layer])
    layer.kernel.assign(KERNEL)
    opt = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.0), initial_scale=KNOWN_SCALE, dynamic_growth_steps=10**6
    )
    model.compile(opt, loss=sum_loss)
    probe = mpwatch.ProbeMonitor(logdir, every=2, probe_data=(X, np.zeros((1, 4), np.float32)))
    data = (np.repeat(X, 3, 0), np.zeros((3, 4), np.float32))
    model.fit(*data, batch_size=1, epochs=2, verbose=0, callbacks=[probe], shuffle=False)
    return {"x": X.tolist(), "c": C.tolist(), "kernel": KERNEL.tolist(), "scale": KNOWN_SCALE}


def _bn_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(),
            keras.layers.Dropout(0.5, name="drop"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, dtype="float32", name="head"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def probe_bn(logdir):
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(48, 8, 8, 2)).astype("float32")
    y = rng.normal(size=(48, 3)).astype("float32")
    weights = []
    for monitored in (False, True):
        model = _bn_model()
        callbacks = [mpwatch.ProbeMonitor(logdir, every=1)] if monitored else []
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
        weights.append([np.asarray(v).tolist() for v in model.weights])
    return {"identical": weights[0] == weights[1], "n_weights": len(weights[0])}


def refits(logdir):
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 16)).astype("float32")
    x[8] *= 1e5  # batch 1 of every fit overflows float16
    y = rng.normal(size=(64, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(5)
        inp = keras.Input((16,))
        out = keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(8)(inp))
        model = keras.Model(inp, out)
        model.compile(keras.optimizers.SGD(0.01), "mse")
        return model

    watched, plain = build(), build()
    traces = []
    original = watched.train_step

    def train_step(state, data):  # runs in Python only while jax traces the step
        apply = watched.optimizer.__dict__.get("stateless_apply")
        traces.append([fit_index[0], bool(getattr(apply, "_mpwatch_tap", False))])
        return original(state, data)

    object.__setattr__(watched, "train_step", train_step)
    fit_index = [0]
    plan = [True, True, False, True]
    scales = []
    for i, with_mpwatch in enumerate(plan):
        fit_index[0] = i
        observer = Observer()
        cbs = [observer]
        if with_mpwatch:
            cbs.insert(0, mpwatch.MixedPrecisionMonitor(logdir, log_every=3, profile=False))
        watched.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=cbs)
        plain.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        if with_mpwatch:
            scales += observer.scale
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(watched.weights, plain.weights)
    )
    return {"traces": traces, "scales": scales, "identical": same}


def budget(logdir):
    """The BatchNormalization + Dropout model of probe_bn, plain and under the default cost
    budget (its probe's compile is far over 5% of this fit): the weights, and the decisions."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(48, 8, 8, 2)).astype("float32")
    y = rng.normal(size=(48, 3)).astype("float32")
    weights, monitor = [], None
    for monitored in (False, True):
        model = _bn_model()
        callbacks = []
        if monitored:
            monitor = mpwatch.MixedPrecisionMonitor(logdir, budget=0.05)
            callbacks = [monitor]
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
        weights.append([np.asarray(v).tolist() for v in model.weights])
    # the probe compiled ahead (lower() here, compile() on a thread: what a GPU host does) gives
    # the very record of the probe compiled when it runs
    from mpwatch.record.probe.probe import Probe

    batch = (x[:8], y[:8])
    ahead, direct = Probe(model), Probe(model)
    assert ahead.precompile(batch)
    got = [p.run(batch)["model"] for p in (ahead, direct)]
    return {
        "identical": weights[0] == weights[1],
        "ahead": any(getattr(p, "_ahead", False) for p in monitor.parts),
        "ahead_same": json.dumps(got[0], sort_keys=True, default=str)
        == json.dumps(got[1], sort_keys=True, default=str),
    }


def syncs(logdir):
    """How often Keras wrote its JAX training state back to the variables (``jax_state_sync``
    doing work, counted on the class) during monitored fits of 8 and of 32 batches: a callback
    that reads ``self.model`` on a batch hook has Keras do it, and rebuild the state, every
    batch."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(6)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    counts = {}
    cls = keras.Model
    original = cls.jax_state_sync

    def counted(self):
        if getattr(self, "_jax_state", None) and not self._jax_state_synced:
            counts[current] = counts.get(current, 0) + 1
        return original(self)

    cls.jax_state_sync = counted
    try:
        for current in (8, 32):
            keras.utils.set_random_seed(5)
            inp = keras.Input((16,))
            out = keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(8)(inp))
            model = keras.Model(inp, out)
            model.compile(keras.optimizers.SGD(0.01), "mse")
            monitor = mpwatch.MixedPrecisionMonitor(
                os.path.join(logdir, str(current)), budget=None, probe=False, profile=(500, 501)
            )  # every part there; the profile's range lies past the fit
            model.fit(x[: 8 * current], y[: 8 * current], batch_size=8, shuffle=False, verbose=0,
                      callbacks=[monitor])  # fmt: skip
    finally:
        cls.jax_state_sync = original
    return {str(k): v for k, v in counts.items()}


def compiles(logdir):
    """The programs XLA compiled (JAX's own log, ``jax_log_compiles``) during a plain fit and
    during a monitored fit of ``forced``'s model, each after ``jax.clear_caches()``: with the
    gradient counts under a conditional, selected, and apart (a second program, compiled on a
    thread: its one program of its own), and ``steps_per_execution`` 4. mpwatch's recording may
    change the train step's program, never add one beyond that (its probe and profile are off
    here: they compile their own programs when the budget lets them run)."""
    import logging

    import jax

    from mpwatch.record.tap.jax_programs import TwoPrograms
    from mpwatch.record.tap.jax_tap import JaxTap

    names = []

    class Names(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if msg.startswith("Finished XLA compilation of "):
                names.append(msg[len("Finished XLA compilation of ") :].split(" in ")[0])

    handler, log = Names(), logging.getLogger("jax")
    log.addHandler(handler)
    level, log.level = log.level, logging.WARNING
    jax.config.update("jax_log_compiles", True)
    got = {}
    try:
        TwoPrograms.wait_at_count_steps = True
        for name, monitored, way, spe in [
            ("plain", False, None, 1), ("cond", True, "cond", 1), ("select", True, "select", 1),
            ("apart", True, "apart", 1), ("plain_spe4", False, None, 4),
            ("select_spe4", True, "select", 4), ("apart_spe4", True, "apart", 4),
        ]:  # fmt: skip
            model, x, y = forced_model(spe)
            model.optimizer.build(model.trainable_variables)
            jax.clear_caches()
            names.clear()
            JaxTap.counts_way = way
            cbs = []
            if monitored:
                cbs = [mpwatch.MixedPrecisionMonitor(os.path.join(logdir, name), log_every=7,
                                                     probe=False, profile=False)]  # fmt: skip
            model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=cbs)
            got[name] = list(names)
    finally:
        JaxTap.counts_way, TwoPrograms.wait_at_count_steps = None, False
        jax.config.update("jax_log_compiles", False)
        log.removeHandler(handler)
        log.level = level
    return got


def main(out):
    truth = {"compiles": compiles(os.path.join(out, "compiles"))}  # first: nothing cached
    for spe, log_every in [(1, 1), (1, 7), (4, 1), (4, 7)]:
        name = f"forced_spe{spe}_every{log_every}"
        truth[name] = forced(os.path.join(out, name), spe, log_every)
    for spe in (1, 4):
        truth[f"async_spe{spe}"] = asynchronous(os.path.join(out, f"async_spe{spe}"), spe)
        for way in ("select", "apart"):
            name = f"{way}_spe{spe}_every7"
            truth[name] = forced(os.path.join(out, name), spe, 7, way=way)
    truth["apart_late"] = apart_late(os.path.join(out, "apart_late"))
    truth["apart_view"] = apart_view(os.path.join(out, "apart_view"))
    truth["apart_short"] = apart_short(os.path.join(out, "apart_short"))
    truth["apart_broken"] = apart_broken(os.path.join(out, "apart_broken"))
    truth["apart_reshaped"] = apart_reshaped(os.path.join(out, "apart_reshaped"))
    truth["async_validation"] = async_validation(os.path.join(out, "async_validation"))
    truth["custom_unscaled"] = custom_unscaled(os.path.join(out, "custom_unscaled"))
    for worker in (True, False):
        name = f"unknown_{'worker' if worker else 'training'}"
        truth[name] = unknown_length(os.path.join(out, name), worker)
    for worker in (True, False):
        name = f"raised_{'worker' if worker else 'training'}"
        truth[name] = raised_then_fit(os.path.join(out, name), worker)
    for worker in (True, False):
        name = f"slow_{'worker' if worker else 'training'}"
        truth[name] = slow_steps(os.path.join(out, name), worker)
    truth["softmax"] = softmax(os.path.join(out, "softmax"))
    truth["probe_known"] = probe_known(os.path.join(out, "probe_known"))
    truth["probe_bn"] = probe_bn(os.path.join(out, "probe_bn"))
    truth["refits"] = refits(os.path.join(out, "refits"))
    truth["budget"] = budget(os.path.join(out, "budget"))
    truth["syncs"] = syncs(os.path.join(out, "syncs"))
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
