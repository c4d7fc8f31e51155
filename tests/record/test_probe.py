"""ProbeMonitor during model.fit, read back with an independent parser (summary_iterator + zlib +
json, not mpwatch's reader): ground-truth underflow, the first non-finite layer, the sweep, training
at the recommended scale, bfloat16, the float32 pre-flight, no twin, failure isolation, size."""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import zlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from mpwatch import contract  # noqa: E402
from mpwatch.record.callbacks.probe_monitor import ProbeMonitor  # noqa: E402
from mpwatch.record.probe.probe import Probe  # noqa: E402
from mpwatch.record.runtime.writer import RunWriter  # noqa: E402


# --- an independent reader ------------------------------------------------------------------------
def read_events(logdir):
    """(records, scalars): records[kind] = [(step, payload)], scalars[tag] = [(step, value)]."""
    records, scalars = {}, {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.tag.startswith("mpwatch/record/"):
                    meta = json.loads(v.metadata.plugin_data.content.decode())
                    assert v.metadata.plugin_data.plugin_name == "mpwatch"
                    payload = json.loads(zlib.decompress(v.tensor.string_val[0]).decode())
                    records.setdefault(meta["kind"], []).append((event.step, payload))
                elif v.tag.startswith("mpwatch/"):
                    value = (
                        float(tf.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
                    )
                    scalars.setdefault(v.tag, []).append((event.step, value))
    return records, scalars


def col(table, name):
    i = table["columns"].index(name)
    return [row[i] for row in table["data"]]


@pytest.fixture
def policy():
    old = keras.mixed_precision.global_policy()

    def set_(name):
        keras.mixed_precision.set_global_policy(name)

    yield set_
    keras.mixed_precision.set_global_policy(old)


def f16_zero(v):
    return np.asarray(v, np.float32).astype(np.float16) == 0


# the known model of test_underflow: every scaled product a power of two or zero
X = np.array([[2.0**-4, 0.0, 2.0**-12, 1.0, 2.0**-8]], np.float32)
C = np.array([[2.0**-40, 2.0**-12, 2.0**-22, 2.0**-30]], np.float32)
KERNEL = np.ones((5, 4), np.float32)
KERNEL[:, 2] = -1.0  # a dead ReLU unit


def sum_loss(y_true, y_pred):
    return tf.reduce_sum(tf.cast(y_pred, tf.float32) * C)


def known_model(scale=None, lr=0.0):
    layer = keras.layers.Dense(4, use_bias=False, activation="relu", name="known")
    model = keras.Sequential([keras.Input((5,)), layer])
    layer.kernel.assign(KERNEL)
    opt = keras.optimizers.SGD(lr)
    if scale is not None:
        opt = keras.optimizers.LossScaleOptimizer(
            opt, initial_scale=scale, dynamic_growth_steps=10**6
        )
    model.compile(opt, loss=sum_loss)
    return model


def known_truth(scale):
    g = X.T @ (C * (X @ KERNEL > 0))
    return int((g != 0).sum()), int(((g != 0) & f16_zero(g * scale)).sum())


def test_fit_records_the_true_underflow(policy, tmp_path):
    policy("mixed_float16")
    scale = 2.0**10
    model = known_model(scale)
    data = (np.repeat(X, 3, 0), np.zeros((3, 4), np.float32))
    mon = ProbeMonitor(str(tmp_path), every=2, probe_data=(X, np.zeros((1, 4), np.float32)))
    model.fit(*data, batch_size=1, epochs=2, verbose=0, callbacks=[mon], shuffle=False)
    records, scalars = read_events(str(tmp_path))
    steps = [s for s, _ in records["probe"]]
    assert steps == [2, 3, 4, 6]  # every 2 batch steps and each epoch's end (3, 6), no duplicates
    nonzero, lost = known_truth(scale)
    assert lost > 0
    for _, p in records["probe"]:
        assert p["mode"] == "float16" and p["reference"] == "float32_twin"
        assert p["loss_scale"] == scale
        assert p["model"]["ref_nonzero"] == nonzero
        assert p["model"]["underflow_count"] == lost
        assert p["model"]["underflow_fraction"] == lost / nonzero
        assert col(p["variables"], "underflow_count") == [lost]
        assert p["model"]["first_nonfinite_layer"] is None
    uf = scalars[contract.PROBE_UNDERFLOW_FRACTION]
    assert [s for s, _ in uf] == steps
    assert all(v == pytest.approx(lost / nonzero) for _, v in uf)
    for tag in (contract.PROBE_GRAD_REL_ERROR, contract.PROBE_RECOMMENDED_SCALE):
        assert len(scalars[tag]) == len(steps)
    assert scalars[contract.PROBE_ACTIVATION_HEADROOM_BITS][0][1] > 10


def test_default_probe_data_is_the_first_batch_and_no_batch_is_lost(policy, tmp_path):
    policy("mixed_float16")
    x = np.arange(24, dtype=np.float32).reshape(6, 4) / 24
    y = np.ones((6, 1), np.float32)

    def build():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        return model

    fit = dict(batch_size=2, epochs=2, verbose=0, shuffle=False)
    plain = build()
    plain.fit(x, y, **fit)
    model = build()
    mon = ProbeMonitor(str(tmp_path), every=1)
    model.fit(x, y, callbacks=[mon], **fit)
    np.testing.assert_array_equal(np.asarray(mon._data[0]), x[:2])
    # the same training as without the probe: every batch, in order, once
    assert int(model.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy())
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    records, _ = read_events(str(tmp_path))
    assert [s for s, _ in records["probe"]] == [1, 2, 3, 4, 5, 6]


def test_first_nonfinite_layer_is_the_one_past_65504(policy, tmp_path):
    policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, name="small", kernel_initializer="identity"),
            keras.layers.Dense(
                4, name="big", kernel_initializer=keras.initializers.Constant(300.0)
            ),
            keras.layers.Dense(2, name="after"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.full((2, 4), 100.0, np.float32)  # "big": 4 * 100 * 300 = 120000 > 65504
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(x, np.zeros((2, 2), np.float32)))
    model.fit(x, np.zeros((2, 2), np.float32), epochs=1, verbose=0, callbacks=[mon])
    records, _ = read_events(str(tmp_path))
    p = records["probe"][-1][1]
    assert p["model"]["first_nonfinite_layer"] == "big"
    layers = p["layers"]
    assert col(layers, "layer") == ["small", "big", "after"]
    small_row = col(layers, "max_abs_activation")
    assert small_row[0] == pytest.approx(100.0)
    assert math.isinf(small_row[1])
    assert col(layers, "activation_headroom_bits")[1] == -math.inf
    assert col(layers, "nonfinite")[1] > 0


def test_sweep_over_scales_recorded_underflow_never_rises(policy, tmp_path):
    policy("mixed_float16")
    rng = np.random.default_rng(3)
    x = (2.0 ** rng.integers(-20, 0, size=(1, 16))).astype(np.float32)
    c = (2.0 ** rng.integers(-30, -6, size=(1, 8))).astype(np.float32)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, use_bias=False)])

    def loss(y_true, y_pred):
        return tf.reduce_sum(tf.cast(y_pred, tf.float32) * c)

    probe = Probe(model, loss_fn=loss)
    writer = RunWriter(str(tmp_path))
    for step, k in enumerate(range(0, 22, 3), start=1):
        Probe.write(writer, step, probe.run((x, np.zeros((1, 8), np.float32)), scale=2.0**k))
    writer.close()
    records, scalars = read_events(str(tmp_path))
    fracs = [p["model"]["underflow_fraction"] for _, p in records["probe"]]
    assert [v for _, v in scalars[contract.PROBE_UNDERFLOW_FRACTION]] == pytest.approx(fracs)
    assert fracs[0] > fracs[-1]
    assert all(a >= b for a, b in zip(fracs, fracs[1:])), fracs
    # and the sweep inside one record predicts the measured values at the measured scales
    g = x.T @ c
    for _, p in records["probe"]:
        sw = p["sweep"]
        under = dict(zip(col(sw, "scale"), col(sw, "predicted_underflow_fraction")))
        truth = np.mean(g * p["loss_scale"] < 2.0**-24)
        assert under[p["loss_scale"]] == pytest.approx(truth, abs=0)
        assert all(a >= b for a, b in zip(list(under.values()), list(under.values())[1:]))


def test_training_at_the_recommended_scale(policy, tmp_path):
    policy("mixed_float16")
    rng = np.random.default_rng(4)
    x = (2.0 ** rng.integers(-24, -14, size=(8, 16))).astype(np.float32)
    y = np.zeros((8, 4), np.float32)

    def build(scale):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1e-3), initial_scale=scale)
        m.compile(opt, "mse")
        return m

    default = build(2.0**15)
    p_default = Probe(default).run((x, y))
    recommended = p_default["recommended_scale"]
    assert recommended is not None and recommended > 2.0**15
    assert p_default["model"]["underflow_fraction"] > 0

    model = build(recommended)
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(x, y))
    model.fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[mon])
    records, _ = read_events(str(tmp_path))
    assert int(model.optimizer.iterations.numpy()) == 5  # no step skipped: no overflow
    assert float(model.optimizer.dynamic_scale.numpy()) == recommended
    for _, p in records["probe"]:
        assert p["loss_scale"] == recommended
        assert p["model"]["underflow_fraction"] <= p_default["model"]["underflow_fraction"]
        assert p["model"]["nonfinite"] == 0
        assert p["model"]["first_nonfinite_layer"] is None


def test_bfloat16_record(policy, tmp_path):
    policy("mixed_bfloat16")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile("sgd", "mse")
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(x, y))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[mon])
    records, scalars = read_events(str(tmp_path))
    p = records["probe"][-1][1]
    assert p["mode"] == "bfloat16"
    assert p["loss_scale"] is None and p["recommended_scale"] is None
    assert p["sweep"]["data"] == []
    assert p["reference"] == "float32_twin"
    assert p["model"]["underflow_fraction"] == 0.0
    # 8 bits of mantissa: a relative error around 2**-8, not 0 and not float16's 2**-11 scale only
    assert 1e-4 < p["model"]["grad_rel_error"] < 0.05
    assert p["histogram"]["window_log2"][0] == -133
    assert contract.PROBE_RECOMMENDED_SCALE not in scalars
    assert contract.PROBE_GRAD_REL_ERROR in scalars


def test_float32_preflight_record(policy, tmp_path):
    policy("float32")
    model = known_model(None)  # a float32 model: no loss scale
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(X, np.zeros((1, 4), np.float32)))
    model.fit(X, np.zeros((1, 4), np.float32), epochs=1, verbose=0, callbacks=[mon])
    records, _ = read_events(str(tmp_path))
    p = records["probe"][-1][1]
    assert p["mode"] == "preflight"
    assert p["loss_scale"] == 2.0**15
    assert "switched to mixed_float16" in p["reference_note"]
    nonzero, lost = known_truth(2.0**15)
    assert lost > 0
    assert p["model"]["ref_nonzero"] == nonzero
    assert p["model"]["underflow_count"] == lost
    assert col(p["layers"], "underflow_count") == [lost]


def test_preflight_names_the_layer_that_would_overflow(policy):
    policy("float32")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, name="fine", kernel_initializer="ones"),
            keras.layers.Dense(4, name="huge", kernel_initializer=keras.initializers.Constant(1e3)),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile("sgd", "mse")
    x = np.full((2, 4), 50.0, np.float32)  # "fine": 200, "huge": 4 * 200 * 1000 > 65504
    p = Probe(model).run((x, np.zeros((2, 1), np.float32)))
    assert p["mode"] == "preflight"
    assert p["model"]["first_nonfinite_layer"] == "huge"
    assert col(p["layers"], "activation_headroom_bits")[1] == -math.inf


class Opaque(keras.Model):
    """A subclassed model Keras cannot rebuild: its constructor takes an object, not a config."""

    def __init__(self, thing, **kwargs):
        super().__init__(**kwargs)
        self.thing = thing
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        raise NotImplementedError


def test_a_model_keras_cannot_rebuild_still_gets_its_float32_reference(policy, tmp_path):
    # the twin is the same model under a float32 policy view: nothing is rebuilt
    policy("mixed_float16")
    model = Opaque(object())
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.ones((4, 3), np.float32)
    y = np.zeros((4, 2), np.float32)
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(x, y))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[mon])
    records, _ = read_events(str(tmp_path))
    p = records["probe"][-1][1]
    assert p["reference"] == "float32_twin" and p["reliable"] is True
    assert model.dense.compute_dtype == "float16"  # the view was restored
    # the reference gradient, computed here in float64 numpy: d/dW mean((xW+b)^2)
    w, b = (np.asarray(v, np.float64) for v in model.dense.weights)
    out = x @ w + b
    ref = x.T @ (2 * out / out.size)
    assert p["model"]["ref_nonzero"] == int(np.count_nonzero(ref)) + int(
        np.count_nonzero((2 * out / out.size).sum(0))
    )


class Float16Only(keras.layers.Layer):
    """A user's layer that cannot compute in float32 (it checks its input's dtype)."""

    def __init__(self):  # no **kwargs, as users write them
        super().__init__()

    def call(self, x):
        if x.dtype != "float16":
            raise TypeError(f"Float16Only wants float16, got {x.dtype}")
        return x * 2


def test_without_a_twin_the_record_says_which_layer_and_the_fix(policy, tmp_path, caplog):
    policy("mixed_float16")
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(2)(Float16Only()(inp)))
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.ones((4, 3), np.float32)
    y = np.zeros((4, 2), np.float32)
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(x, y))
    with caplog.at_level(logging.WARNING, logger="mpwatch"):
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[mon])
    assert sum("no float32 reference" in r.getMessage() for r in caplog.records) == 1
    records, scalars = read_events(str(tmp_path))
    p = records["probe"][-1][1]
    assert p["reference"] == "none"
    note = p["reference_note"]
    assert "Float16Only" in note and "self.compute_dtype" in note
    assert len(note) < 400  # one short notice, no config dump
    assert p["model"]["underflow_fraction"] is None
    assert 0.0 <= p["model"]["zero_fraction"] <= 1.0
    assert p["histogram"]["source"] == "mixed_unscaled"
    assert len(records["notice"]) == 1
    assert contract.PROBE_UNDERFLOW_FRACTION not in scalars


def test_a_failing_probe_never_stops_training(policy, tmp_path, caplog):
    policy("mixed_float16")
    calls = []

    def broken(y_true, y_pred):
        calls.append(1)
        raise RuntimeError("boom")

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(x, y), loss_fn=broken)
    batches = []
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    with caplog.at_level(logging.ERROR, logger="mpwatch"):
        model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[mon, count])
    assert len(batches) == 8  # every batch of both epochs ran
    assert len(calls) == 1  # the probe stopped after its first failure
    assert sum("probe" in r.getMessage() for r in caplog.records) == 1
    records, _ = read_events(str(tmp_path))
    (notice,) = [p for _, p in records["notice"] if p["part"] == "probe"]
    assert "boom" in notice["message"]
    assert "probe" not in records


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(ValueError, match="every"):
        ProbeMonitor(str(tmp_path), every=0)
    with pytest.raises(ValueError, match="loss_fn"):
        ProbeMonitor(str(tmp_path), loss_fn="mse")


def _probe_of_size(n_layers):
    """A Probe whose payload is built from stats arrays shaped like an n-layer Dense model's (two
    variables per layer), without building the model: the record's size depends only on shapes."""
    from types import SimpleNamespace

    from mpwatch import formats
    from mpwatch.record.probe import underflow

    rng = np.random.default_rng(0)
    names = [f"block_{i:04d}/dense_layer_{i:04d}" for i in range(n_layers)]
    variables = [SimpleNamespace(path=f"{n}/{w}") for n in names for w in ("kernel", "bias")]
    probe = Probe.__new__(Probe)
    probe.model = SimpleNamespace(trainable_variables=variables)
    probe.view, probe.random_off = object(), []
    probe.mode, probe.fmt, probe.margin_bits = "float16", formats.FLOAT16, 4.0
    probe.reference, probe.note, probe.kind = "float32_twin", None, "sequential"
    probe.layer_names = names
    probe._var_layer = [n for n in names for _ in range(2)]
    probe._act_layer_index = list(range(n_layers))
    grads = np.abs(rng.normal(size=(2 * n_layers, 7))) * 1000
    grads[:, underflow.G_UNDERFLOW] = np.minimum(grads[:, 1], grads[:, 2])
    out = {
        "grads": grads,
        "acts": np.abs(rng.normal(size=(n_layers, 6))) * 100,
        "act_grads": np.abs(rng.normal(size=(n_layers, 4))),
        "hist": rng.integers(0, 1000, size=underflow.NUM_BINS),
        "zeros": np.float64(12),
        "loss": np.float32(1.5),
        "ref_loss": np.float32(1.5),
        "train_loss": np.float32(1.5),
        "own_loss": np.float32(1.5),
    }
    return probe, out


def test_a_1000_layer_model_fits_the_record_limit(tmp_path):
    probe, out = _probe_of_size(1000)
    payload = probe._payload(out, 2.0**15)
    assert len(payload["variables"]["data"]) == 2000
    assert len(payload["layers"]["data"]) == 1000
    assert len(contract.encode_payload(payload)) <= contract.MAX_RECORD_BYTES
    writer = RunWriter(str(tmp_path))
    Probe.write(writer, 1, payload)
    writer.close()
    records, _ = read_events(str(tmp_path))
    assert len(records["probe"]) == 1


def test_an_oversized_probe_record_is_split(tmp_path, monkeypatch):
    probe, out = _probe_of_size(1000)
    payload = probe._payload(out, 2.0**15)
    full = len(contract.encode_payload(payload))
    monkeypatch.setattr(contract, "MAX_RECORD_BYTES", full - 1)  # just too big: split
    writer = RunWriter(str(tmp_path))
    Probe.write(writer, 1, payload)
    writer.close()
    records, _ = read_events(str(tmp_path))
    parts = [p for _, p in records["probe"]]
    assert len(parts) >= 2
    assert parts[0]["model"] == payload["model"] and parts[0]["parts"] == len(parts)
    rows = [r for p in parts for r in p["variables"]["data"]]
    assert rows == payload["variables"]["data"]
    assert [p.get("part") for p in parts[1:]] == list(range(1, len(parts)))


def test_the_probe_warns_nothing_into_the_fit(policy, tmp_path):
    """The probe's tap takes its input as the model does: a Functional model of one input given
    alone (keras.applications') warned "The structure of `inputs` doesn't match the expected
    structure" into the user's fit when a fix check called the tap on the batch's array."""
    import warnings

    policy("mixed_float16")
    inp = keras.Input((5,))
    model = keras.Model(inp, keras.layers.Dense(4, name="d")(keras.layers.Dense(8)(inp)))
    model.compile(keras.optimizers.SGD(0.0), loss=sum_loss)
    probe = Probe(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe.run((np.repeat(X, 2, 0), np.zeros((2, 4), np.float32)))
        outs = probe.tap(np.repeat(X, 2, 0), training=True)  # as the fix checks call it
    said = [str(w.message) for w in caught if "structure" in str(w.message)]
    assert not said, said
    assert len(outs) == 1 + 2  # the output, then each layer's
