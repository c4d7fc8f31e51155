"""The twin is the same model under another policy: Sequential, Functional, nested, subclassed and
user layers without ``**kwargs`` or a ``Lambda`` all get one; the view restores every policy; a
float32 view computes what a float32 model computes; random layers are off only inside the block.
Then the probe on the train step's network: BatchNormalization on batch statistics with its state
untouched, Dropout the same in both passes, the loss checked against the train step's."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from mpwatch.record.probe.probe import Probe  # noqa: E402
from mpwatch.record.probe.twin import (  # noqa: E402
    PolicyView,
    model_kind,
    random_layers,
    random_layers_off,
)


def compute_dtypes(model):
    return {
        ly.name: ly.compute_dtype
        for ly in model._flatten_layers(include_self=False)
        if type(ly).__name__ != "InputLayer"  # its policy computes nothing
    }


def sequential():
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2, dtype="float32", name="head"),
        ]
    )


def functional():
    inp = keras.Input((6,))
    inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8)], name="inner")
    h = keras.layers.Dense(8, activation="relu")(inp)
    h = inner(h)
    h = keras.layers.Lambda(lambda t: t * 0.5)(h)
    out = keras.layers.Dense(2)(keras.layers.Add()([h, h]))
    return keras.Model(inp, out)


class Scale(keras.layers.Layer):
    """A user layer as keras.io writes them: ``__init__`` without ``**kwargs``."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor
        self.dense = keras.layers.Dense(6)

    def call(self, x):
        return self.dense(x) * self.factor


class Sub(keras.Model):
    def __init__(self, thing):  # no config Keras could rebuild it from
        super().__init__()
        self.thing = thing
        self.a = Scale(2.0)
        self.b = keras.layers.Dense(1)

    def call(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("make", [sequential, functional, lambda: Sub(object())])
def test_float32_view_computes_what_a_float32_model_computes(mixed16, make):
    model = make()
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    mixed_out = np.asarray(model(x), np.float32)
    before = compute_dtypes(model)
    assert "float16" in before.values()
    with PolicyView(model, "float32"):
        inside = compute_dtypes(model)
        out32 = np.asarray(model(x))
    assert set(inside.values()) == {"float32"}
    assert compute_dtypes(model) == before  # restored
    # ground truth: the same architecture built under float32 with the same weights
    keras.mixed_precision.set_global_policy("float32")
    ref = make()
    ref(x)
    ref.set_weights(model.get_weights())
    expected = np.asarray(ref(x))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, expected, rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(mixed_out - expected)) > 0  # the mixed pass really differs


def test_pinned_and_integer_layers_keep_their_policy(mixed16):
    inp = keras.Input((3,), dtype="int32")
    h = keras.layers.Embedding(10, 4)(inp)
    out = keras.layers.Dense(2, dtype="float32", name="head")(h)
    model = keras.Model(inp, out)
    view = PolicyView(model, "float32")
    assert "head" not in view.layers
    with view:
        assert model.get_layer("head").dtype_policy.name == "float32"
    assert model.get_layer("head").dtype_policy.name == "float32"


def test_preflight_view_is_mixed():
    model = sequential()  # built under float32
    view = PolicyView(model, "mixed_float16")
    with view:
        got = compute_dtypes(model)
    assert got["head"] == "float16" and got[model.layers[0].name] == "float16"
    assert set(compute_dtypes(model).values()) == {"float32"}


def test_a_view_restores_policies_when_the_block_raises(mixed16):
    model = sequential()
    with pytest.raises(RuntimeError):
        with PolicyView(model, "float32"):
            raise RuntimeError("boom")
    assert model.layers[0].compute_dtype == "float16"


def test_random_layers_are_off_only_inside_the_block():
    model = keras.Sequential([keras.Input((100,)), keras.layers.Dropout(0.5, name="drop")])
    x = np.ones((2, 100), np.float32)
    layers = random_layers(model)
    assert [ly.name for ly in layers] == ["drop"]
    with random_layers_off(layers):
        np.testing.assert_array_equal(np.asarray(model(x, training=True)), x)
    assert np.count_nonzero(np.asarray(model(x, training=True)) == 0) > 0  # dropout again
    assert "call" not in vars(model.layers[0])


def test_model_kind():
    assert model_kind(sequential()) == "sequential"
    assert model_kind(functional()) == "functional"
    assert model_kind(Sub(object())) == "subclassed"


# --- the probe measures the train step's network ------------------------------------------------
def bn_model():
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(),
            keras.layers.Dropout(0.5, name="drop"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, name="out"),
        ]
    )


def test_probe_runs_batchnorm_on_batch_statistics_and_leaves_the_model_unchanged(mixed16):
    model = bn_model()
    model.compile(keras.optimizers.SGD(0.1), keras.losses.MeanSquaredError())
    rng = np.random.default_rng(1)
    # inputs far from the (initial) moving statistics: inference mode would be another network
    x = (rng.normal(size=(16, 8, 8, 3)) * 30 + 50).astype(np.float32)
    y = rng.normal(size=(16, 3)).astype(np.float32)
    state = [np.asarray(v) for v in model.non_trainable_variables]
    weights = [np.asarray(v) for v in model.trainable_variables]
    p1 = Probe(model).run((x, y))
    p2 = Probe(model).run((x, y))
    for before, v in zip(state, model.non_trainable_variables):
        np.testing.assert_array_equal(before, np.asarray(v))  # moving stats, seed states
    for before, v in zip(weights, model.trainable_variables):
        np.testing.assert_array_equal(before, np.asarray(v))
    # the train step's loss on this batch, computed here: training mode, dropout as in the probe
    model.get_layer("drop").rate = 0.0
    train_loss = float(model.compute_loss(x=x, y=y, y_pred=model(x, training=True)))
    infer_loss = float(model.compute_loss(x=x, y=y, y_pred=model(x, training=False)))
    assert abs(train_loss - infer_loss) > 0.1 * abs(train_loss)  # the two networks differ
    assert p1["model"]["loss"] == pytest.approx(train_loss, rel=1e-3)
    assert p1["model"]["train_loss"] == pytest.approx(train_loss, rel=1e-3)
    assert p1["reliable"] is True and p1["unreliable_reason"] is None
    assert p1["random_layers_off"] == ["drop"]
    # deterministic: the dropout layer drew no masks
    assert p1["model"]["underflow_count"] == p2["model"]["underflow_count"]
    assert p1["model"]["grad_rel_error"] == p2["model"]["grad_rel_error"]


class Doubled(keras.Model):
    """A Functional model whose own call differs from its layer graph: the probe's tapped graph
    is not what the train step runs."""

    def call(self, inputs, training=None):
        return super().call(inputs, training=training) * 3.0


def test_a_probe_that_disagrees_with_the_train_step_is_marked_unreliable(mixed16):
    inp = keras.Input((4,))
    model = Doubled(inp, keras.layers.Dense(2)(inp))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.ones((8, 4), np.float32)
    y = np.zeros((8, 2), np.float32)
    p = Probe(model).run((x, y))
    expected = float(np.mean(np.asarray(model(x), np.float32) ** 2))
    assert p["model"]["train_loss"] == pytest.approx(expected, rel=1e-2)
    assert p["reliable"] is False
    assert "train step" in p["unreliable_reason"]


@pytest.mark.parametrize("make", [sequential, functional])
def test_a_model_whose_call_is_its_graph_gets_no_second_forward_pass(mixed16, monkeypatch, make):
    """Keras' own call of a Functional or Sequential model runs the graph the probe taps: the
    loss check's extra forward pass of the model's call would compute the probe's own loss
    again, so it is not run (a model that overrides call still gets it: the test above)."""
    from keras.src.models.functional import Functional

    model = make()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    callers = []
    original = Functional.call

    def spy(self, *args, **kwargs):
        callers.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Functional, "call", spy)  # Keras' own call, counted: still the graph's
    x = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    y = np.zeros((8, 2), np.float32)
    probe = Probe(model)
    probe.float8 = False  # float8 readiness runs the model's call on purpose (its own pass)
    p = probe.run((x, y))
    own = {id(model), id(getattr(model, "_functional", None))}
    assert probe.check_loss is False
    assert not [c for c in callers if id(c) in own]  # the model's own call never ran
    expected = float(model.compute_loss(x=x, y=y, y_pred=model(x, training=True)))
    assert p["model"]["loss"] == pytest.approx(expected, rel=1e-3)
    assert p["model"]["train_loss"] == p["model"]["loss"]
    assert p["reliable"] is True


def test_probe_records_the_batch_and_integer_ids_a_cast_rounds(mixed16):
    inp = keras.Input((5,), name="ids")  # float32, as keras.io's Transformer writes it
    h = Scale(1.0)(inp)  # a user layer: autocasts its input to float16
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(h))
    model.compile("sgd", "mse")
    ids = np.array([[1, 2049, 19999, 7, 4097]] * 3, np.float32)
    p = Probe(model).run((ids, np.zeros((3, 1), np.float32)))
    assert p["batch"] == {"size": 3, "source": "probe_data"}
    rows = [dict(zip(p["inputs"]["columns"], r)) for r in p["inputs"]["data"]]
    (row,) = rows
    assert row["integer_valued"] is True and row["cast_to"] == "float16"
    assert row["consumers"] == [model.layers[1].name]
    truth = int(np.count_nonzero(ids.astype(np.float16).astype(np.float32) != ids))
    assert truth == 9 and row["changed"] == truth


@pytest.mark.parametrize("given", [False, True], ids=["adapted", "mean-and-variance-given"])
def test_a_float32_view_of_a_normalization_standardizes_features_float16_cannot_hold(
    mixed16, given
):
    """Keras' Normalization casts its mean and variance to its compute dtype when it is built or
    adapted: a feature of prices (mean 1.5e5, variance 7e9) gives inf constants under
    mixed_float16, and a policy switched later still divides by them. The view computes what
    numpy's standardization in float64 gives, and puts the float16 layer back as it was."""
    rng = np.random.default_rng(3)
    data = np.stack([rng.uniform(500, 5000, 256), rng.uniform(1e4, 3e5, 256)], 1)
    mean, var = data.mean(axis=0), data.var(axis=0)
    if given:
        norm = keras.layers.Normalization(mean=mean, variance=var, name="norm")
    else:
        norm = keras.layers.Normalization(name="norm")
        norm.adapt(data.astype("float32"))
    inp = keras.Input((2,))
    model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(norm(inp)))
    x = data[:16].astype("float32")
    want = (data[:16] - mean) / np.sqrt(var)
    before = np.asarray(norm(x))
    assert before.dtype == np.float16 and not np.isfinite(before).all()
    with PolicyView(model, "float32"):
        got = np.asarray(norm(x))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    after = np.asarray(norm(x))
    assert after.dtype == np.float16 and not np.isfinite(after).all()  # as it was
    assert norm.compute_dtype == "float16"
