"""The float32 twin: Sequential, Functional, nested and subclassed models; weights synced without
retracing; a clear TwinUnavailable where Keras cannot rebuild the model."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from mpwatch.record.twin import (  # noqa: E402
    Twin,
    TwinUnavailable,
    build_twin,
    model_kind,
    rewrite_policies,
)


def compute_dtypes(model):
    return {ly.name: ly.compute_dtype for ly in model._flatten_layers(include_self=False)}


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
    out = keras.layers.Dense(2)(keras.layers.Add()([h, h]))
    return keras.Model(inp, out)


@keras.saving.register_keras_serializable("mpwatch_tests")
class Sub(keras.Model):
    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.a = keras.layers.Dense(units, activation="relu")
        self.b = keras.layers.Dense(1)

    def call(self, x):
        return self.b(self.a(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@pytest.mark.parametrize("make", [sequential, functional, lambda: Sub(4)])
def test_twin_is_float32_with_the_same_weights(mixed16, make):
    model = make()
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    model(x)
    twin = Twin.build(model, "float32", example_inputs=x)
    got = compute_dtypes(twin.model)
    assert got and set(got.values()) == {"float32"}
    assert "float16" in set(compute_dtypes(model).values())
    assert [tuple(v.shape) for v in twin.model.weights] == [tuple(v.shape) for v in model.weights]
    twin.sync()
    for a, b in zip(model.weights, twin.model.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # same weights, float32 arithmetic: outputs agree to float16's precision, not bit for bit
    np.testing.assert_allclose(
        np.asarray(model(x), np.float32), np.asarray(twin.model(x)), rtol=1e-2, atol=1e-2
    )


def test_sync_copies_new_weights_without_retracing(mixed16):
    model = sequential()
    twin = Twin.build(model)
    for i in range(3):
        for v in model.trainable_variables:
            v.assign(np.full(v.shape, float(i), np.float32))
        twin.sync()
        for a, b in zip(model.weights, twin.model.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert twin._sync.experimental_get_tracing_count() == 1


def test_pinned_float32_layer_and_int_inputs_are_kept(mixed16):
    inp = keras.Input((3,), dtype="int32")
    h = keras.layers.Embedding(10, 4)(inp)
    out = keras.layers.Dense(1, dtype="float32", name="head")(keras.layers.Flatten()(h))
    model = keras.Model(inp, out)
    twin = build_twin(model)
    assert twin.inputs[0].dtype == "int32"
    assert twin.get_layer("head").compute_dtype == "float32"


def test_preflight_twin_is_mixed():
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = sequential()
        twin = build_twin(model, "mixed_float16")
    finally:
        keras.mixed_precision.set_global_policy(old)
    dtypes = compute_dtypes(twin)
    assert dtypes["head"] == "float16"  # the whole model switched, as set_global_policy would
    assert keras.mixed_precision.global_policy().name == old.name


class Opaque(keras.Model):
    def __init__(self, thing, **kwargs):
        super().__init__(**kwargs)
        self.thing = thing
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        raise NotImplementedError


def test_unrebuildable_model_says_why(mixed16):
    model = Opaque(object())
    model(np.ones((1, 3), np.float32))
    assert model_kind(model) == "subclassed"
    with pytest.raises(TwinUnavailable, match="cannot rebuild Opaque"):
        build_twin(model, example_inputs=np.ones((1, 3), np.float32))


def test_rewrite_policies_only_touches_policies():
    cfg = {
        "layers": [
            {
                "config": {
                    "dtype": {"class_name": "DTypePolicy", "config": {"name": "mixed_float16"}}
                }
            },
            {"config": {"dtype": "int32"}},
            {"config": {"dtype": {"class_name": "DTypePolicy", "config": {"name": "float32"}}}},
        ]
    }
    out = rewrite_policies(cfg, ("mixed_float16",), "float32")
    assert out["layers"][0]["config"]["dtype"] == "float32"
    assert out["layers"][1]["config"]["dtype"] == "int32"
    assert out["layers"][2] == cfg["layers"][2]
