"""Records too large for one event: the gradient table and the layer table of a model with many
variables and layers are split into parts (record/runtime/writer.py), joined back by
``mpwatch.load_run``.

Three tests:

- **A real model of 32,000 trainable variables at the real limit.** 320 custom layers holding 100
  trainable variables each (1 to 16 elements, gradients of spread magnitudes), trained under
  ``mixed_float16`` with a real ``LossScaleOptimizer`` in an eager custom loop recorded by
  :class:`mpwatch.TrainingLoopRecorder` (the same tap and writers as ``fit``). Its
  ``grad_variables`` record (one row per variable, ~18 bytes a row compressed, ~560 KiB) is split
  at the real ``contract.MAX_RECORD_BYTES``; its ``layers`` record (321 rows, a few KB) is
  written whole. Why not ``model.fit``: Keras' own cost of tracing a train step with 30,000
  variables on 2 CPU cores (optimizer update ops per variable, then Grappler) grows faster than
  linearly: 3,000 variables already take 2 minutes without mpwatch. Eager, this model steps in
  ~10 s. Why the layer table stays whole: it needs ~65,000 layers to pass 512 KiB compressed
  (~8 bytes a row), hence the next test.
- **A real fit, with the limit lowered.** A functional model of 100 custom layers holding 3 tiny
  trainable variables each (302 trainable variables) is trained under ``mixed_float16`` with
  :class:`mpwatch.MixedPrecisionMonitor` (gradient health per variable and the layer table on;
  probe and profile off). ``contract.MAX_RECORD_BYTES`` is monkeypatched down to 512 bytes for the
  fit, so the ``grad_variables`` records (~1.5 KB compressed) and the ``layers`` record (~0.8 KB)
  are split while ``run_info`` (~370 bytes) still fits.
- **The real limit, 30,000 rows written directly.** A ``grad_variables`` record of 30,000 rows
  (the statistics computed by ``record/tap/stats.py: shares`` from counts) and a probe record with a
  30,000-row variables table go through ``RunWriter.record`` at the real
  ``contract.MAX_RECORD_BYTES``.

All check the parts with the independent event parser (conftest ``read_events``): several parts
at one step, each compressed payload under the limit, rows in order, and that ``mpwatch.load_run``
gives exactly one row per variable back.
"""

from __future__ import annotations

import zlib

import keras
import numpy as np
import pytest
from builders import probe_payload
from keras import ops

from mpwatch import contract

LOWERED_LIMIT = 512
LAYERS, PER_LAYER = 100, 3


class ManyScalars(keras.layers.Layer):
    """``n`` trainable variables summed into the output.

    By default each of shape (1,), summed as they are. With ``varied=True`` variable ``i`` has
    shape ``(1 + i % 5,)`` and enters as ``c_i * sum(w_i**2)`` with fixed ``c_i`` spread over
    ``1e-12 .. 1``: gradients of different sizes and magnitudes (some under float16's normal
    range), as a real model's are, so the gradient table does not compress to nothing.
    """

    def __init__(self, n, varied=False, **kwargs):
        super().__init__(**kwargs)
        self.n = n
        self.varied = varied

    def build(self, input_shape):
        init = "random_normal" if self.varied else "zeros"
        shapes = [(1 + i % 16 if self.varied else 1,) for i in range(self.n)]
        self.ws = [
            self.add_weight(shape=shape, initializer=init, name=f"w{i}")
            for i, shape in enumerate(shapes)
        ]
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        self.cs = (10.0 ** rng.uniform(-9, 0, self.n)).astype("float32")

    def call(self, x):
        if not self.varied:
            return x + ops.sum(ops.concatenate(self.ws))
        terms = [float(c) * ops.sum(ops.square(w)) for c, w in zip(self.cs, self.ws)]
        return x + ops.sum(ops.stack(terms))

    def compute_output_shape(self, input_shape):
        return input_shape


BIG_LAYERS, BIG_PER_LAYER = 320, 100  # 32,000 variables


@pytest.fixture(scope="module")
def big_model_run(tmp_path_factory):
    """A 30,000-variable model trained 2 steps in an eager custom loop, recorded at log_every=1."""
    import tensorflow as tf

    import mpwatch

    logdir = str(tmp_path_factory.mktemp("huge_vars") / "run")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(1)
        inp = keras.Input((4,))
        h = inp
        for j in range(BIG_LAYERS):
            h = ManyScalars(BIG_PER_LAYER, varied=True, name=f"block_{j:03d}")(h)
        out = keras.layers.Dense(1, dtype="float32", name="head")(h)
        model = keras.Model(inp, out)
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1e-4), initial_scale=2.0**10)
        x = tf.constant(np.random.default_rng(1).normal(size=(8, 4)).astype("float32"))
        y = tf.ones((8, 1))
        losses = []
        with mpwatch.TrainingLoopRecorder(
            model, logdir, optimizer=opt, log_every=1, probe=False, profile=False
        ) as rec:
            for _ in range(2):
                with tf.GradientTape() as tape:
                    loss = ops.mean(ops.square(model(x, training=True) - y))
                    scaled = opt.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)
                rec.step_end(loss=loss)
                losses.append(float(loss))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return {"logdir": logdir, "model": model, "losses": losses}


def test_a_model_of_30000_variables_records_its_tables(big_model_run, read_events):
    import mpwatch

    model = big_model_run["model"]
    paths = [v.path for v in model.trainable_variables]
    assert len(paths) == BIG_LAYERS * BIG_PER_LAYER + 2 and len(set(paths)) == len(paths)
    assert all(np.isfinite(big_model_run["losses"]))
    _, records = read_events(big_model_run["logdir"])

    grads = _parts_by_step(records["grad_variables"])
    assert sorted(grads) == [1, 2]
    written = {}
    for step, parts in grads.items():
        rows = _check_split(parts, "variables", contract.MAX_RECORD_BYTES)
        assert [r[0] for r in rows] == paths  # one row per trainable variable, in order
        sizes = [r[contract.GRAD_VARIABLE_COLUMNS.index("size")] for r in rows]
        assert sizes == [int(np.prod(v.shape)) for v in model.trainable_variables]
        nonfinite = contract.GRAD_VARIABLE_COLUMNS.index("nonfinite_count")
        assert all(r[nonfinite] == 0 for r in rows)  # no overflow at this scale: real statistics
        written[step] = rows

    (layer_parts,) = _parts_by_step(records["layers"]).values()  # written once, whole
    assert len(layer_parts) == 1 and "part" not in layer_parts[0]
    assert len(contract.encode_payload(layer_parts[0])) <= contract.MAX_RECORD_BYTES
    names = [r[0] for r in layer_parts[0]["layers"]["data"]]
    want = [f"block_{j:03d}" for j in range(BIG_LAYERS)] + ["head"]
    assert [n for n in names if n in want] == want

    run = mpwatch.load_run(big_model_run["logdir"])
    assert run.warnings == []
    assert [n for n in run.notices if n["level"] == "error"] == []
    gv = run.grad_variables
    for step, rows in written.items():
        at = gv[gv["step"] == step]
        assert at["variable"].tolist() == paths
        assert at[contract.GRAD_VARIABLE_COLUMNS].values.tolist() == rows
    assert run.layers["name"].tolist() == names


@pytest.fixture(scope="module")
def big_fit(tmp_path_factory):
    import mpwatch

    logdir = str(tmp_path_factory.mktemp("large") / "run")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        inp = keras.Input((4,))
        h = inp
        for j in range(LAYERS):
            h = ManyScalars(PER_LAYER, name=f"many_scalars_{j:03d}")(h)
        out = keras.layers.Dense(1, dtype="float32", name="head")(h)
        model = keras.Model(inp, out)
        model.compile(keras.optimizers.SGD(0.01), "mse")
        x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
        y = np.ones((32, 1), "float32")
        monitor = mpwatch.MixedPrecisionMonitor(
            log_dir=logdir, log_every=2, probe=False, profile=False
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(contract, "MAX_RECORD_BYTES", LOWERED_LIMIT)
            history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[monitor])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return {"logdir": logdir, "model": model, "history": history}


def _parts_by_step(items):
    out: dict[int, list[dict]] = {}
    for step, payload in items:
        out.setdefault(step, []).append(payload)
    return out


def _check_split(parts, table_key, limit):
    assert len(parts) >= 2, f"not split: {len(parts)} part(s)"
    assert [p.get("part") for p in parts] == list(range(len(parts)))
    assert all(p["parts"] == len(parts) for p in parts)
    for p in parts:
        assert len(contract.encode_payload(p)) <= limit
    return [row for p in parts for row in p[table_key]["data"]]


def test_a_real_fit_splits_the_gradient_and_layer_tables(big_fit, read_events):
    import mpwatch

    model = big_fit["model"]
    paths = [v.path for v in model.trainable_variables]
    assert len(paths) == LAYERS * PER_LAYER + 2 and len(set(paths)) == len(paths)
    _, records = read_events(big_fit["logdir"])

    grads = _parts_by_step(records["grad_variables"])
    assert sorted(grads) == [2, 4]
    written = {}
    for step, parts in grads.items():
        rows = _check_split(parts, "variables", LOWERED_LIMIT)
        assert [r[0] for r in rows] == paths  # one row per trainable variable, in order
        assert parts[0]["loss_scale"] > 1  # the head has the record's own keys
        written[step] = rows

    (layer_parts,) = _parts_by_step(records["layers"]).values()  # written once
    layer_rows = _check_split(layer_parts, "layers", LOWERED_LIMIT)
    names = [r[0] for r in layer_rows]
    want = [f"many_scalars_{j:03d}" for j in range(LAYERS)] + ["head"]
    assert [n for n in names if n in want] == want

    run = mpwatch.load_run(big_fit["logdir"])
    assert run.warnings == []
    gv = run.grad_variables
    for step, rows in written.items():
        at = gv[gv["step"] == step]
        assert at["variable"].tolist() == paths
        assert at[contract.GRAD_VARIABLE_COLUMNS].values.tolist() == rows
    assert run.layers["name"].tolist() == names
    assert run.layers["path"].is_unique and len(run.layer_history) == 1


def test_training_is_unaffected_by_large_records(big_fit, read_events):
    import mpwatch

    history = big_fit["history"].history
    assert len(history["loss"]) == 1 and np.isfinite(history["loss"][0])
    run = mpwatch.load_run(big_fit["logdir"])
    # no part stopped: a record too large would have stopped it with an error notice
    assert [n for n in run.notices if n["level"] == "error"] == []
    assert not any("limit" in n["message"] for n in run.notices)
    assert run.info["policy"] == "mixed_float16"
    assert len(run.scalar(contract.LOSS_SCALE)) == 1 + 4  # step 0 (the start) and 4 steps


def test_30000_variables_at_the_real_limit(tmp_path, read_events):
    """A 30,000-variable gradient table and probe at the real contract.MAX_RECORD_BYTES."""
    import mpwatch
    from mpwatch.record.callbacks.gradient_health import variable_layer
    from mpwatch.record.runtime.writer import RunWriter
    from mpwatch.record.tap import stats

    n = 30_000
    rng = np.random.default_rng(0)
    paths = [f"block_{i // 10:04d}/dense_{i % 10}/kernel_{i}" for i in range(n)]
    sizes = rng.integers(1, 4096, n)
    counts = np.zeros((n, stats.NUM_COUNTS))
    counts[:, stats.SIZE] = sizes
    counts[:, stats.ZERO] = rng.integers(0, 3, n)
    counts[:, stats.SUBNORMAL] = np.minimum(rng.integers(0, 50, n), sizes)
    counts[:, stats.MAX_ABS] = rng.lognormal(0, 4, n)
    rows = []
    for path, c in zip(paths, counts):
        s = stats.shares(c)
        rows.append(
            [path, variable_layer(path), s["size"], s["zero_fraction"], s["subnormal_fraction"],
             s["nonfinite_count"], s["max_abs"], s["headroom_bits"]]
        )  # fmt: skip
    grads = {
        "loss_scale": 32768.0,
        "variables": contract.table(contract.GRAD_VARIABLE_COLUMNS, rows),
    }
    probe_rows = [
        [p, variable_layer(p), int(sz), int(sz), int(u), float(u / sz), float(e), float(e) * 8]
        for p, sz, u, e in zip(paths, sizes, rng.integers(0, 2, n), rng.random(n) * 1e-3)
    ]
    probe = probe_payload(5, 32768.0)
    probe["variables"] = contract.table(contract.PROBE_VARIABLE_COLUMNS, probe_rows)
    assert len(contract.encode_payload(grads)) > contract.MAX_RECORD_BYTES
    assert len(contract.encode_payload(probe)) > contract.MAX_RECORD_BYTES

    w = RunWriter(str(tmp_path))
    w.record(contract.KIND_GRAD_VARIABLES, 5, grads)
    w.record(contract.KIND_PROBE, 5, probe)
    w.close()
    _, records = read_events(str(tmp_path))
    got = _check_split(
        [p for _, p in records["grad_variables"]], "variables", contract.MAX_RECORD_BYTES
    )
    assert got == contract.json_safe(rows, nonfinite="keep")
    got = _check_split([p for _, p in records["probe"]], "variables", contract.MAX_RECORD_BYTES)
    assert [r[0] for r in got] == paths

    run = mpwatch.load_run(str(tmp_path))
    assert run.warnings == []
    assert run.grad_variables["variable"].tolist() == paths
    assert run.probe_variables["variable"].tolist() == paths
    assert run.latest_probe().step == 5 and len(run.latest_probe().layers) == 4
