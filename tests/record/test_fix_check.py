"""The probe's fix checks (mpwatch/record/probe/fix_check.py) against the same passes done by hand:
the layer's policy switched with Keras itself, gradients with TensorFlow's tape, errors with numpy;
and the model's state the same afterwards."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")


def _model(policy, scale_in=1.0):
    with _scope(policy):
        keras.utils.set_random_seed(0)
        inp = keras.Input((8,))
        h = keras.layers.Dense(32, activation="relu", name="d1")(inp)
        h = keras.layers.Dense(32, activation="relu", name="d2")(h)
        h = keras.layers.BatchNormalization(name="bn")(h)
        out = keras.layers.Dense(1, dtype="float32", name="out")(h)
        model = keras.Model(inp, out)
        model.compile("sgd", "mse")
    return model


class _scope:
    def __init__(self, policy):
        self.policy = policy

    def __enter__(self):
        self.old = keras.mixed_precision.global_policy().name
        keras.mixed_precision.set_global_policy(self.policy)

    def __exit__(self, *exc):
        keras.mixed_precision.set_global_policy(self.old)


def _grads(model, x, y, scale):
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        scaled = loss * scale
    grads = tape.gradient(scaled, model.trainable_variables)
    return [np.asarray(g, np.float64) / scale for g in grads]


@pytest.mark.parametrize(("policy", "scale"), [("mixed_float16", 1024.0), ("mixed_bfloat16", 1.0)])
def test_gradient_check_equals_the_pass_done_by_hand_and_leaves_the_state(policy, scale):
    from mpwatch.record.probe.fix_check import check_gradient_fixes
    from mpwatch.record.probe.probe import Probe

    model = _model(policy)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    probe = Probe(model)
    assert probe.mode == policy[len("mixed_"):]
    probe.run((x, y), scale=scale)  # prepares the probe as a fit would
    before = [np.array(v.numpy()) for v in model.non_trainable_variables]
    checks = check_gradient_fixes(probe, x, y, None, scale, {"d2": 0.5, "d1": 1e-3, "out": 1e-3})
    after_state = [np.array(v.numpy()) for v in model.non_trainable_variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after_state))
    assert [c["layer"] for c in checks] == ["d2"]
    # by hand: d2 in float32 in the mixed model; the reference: a float32 twin, same weights
    model.get_layer("d2").dtype_policy = "float32"
    try:
        mixed = _grads(model, x, y, scale)
    finally:
        model.get_layer("d2").dtype_policy = policy
    twin = _model("float32")
    twin.set_weights(model.get_weights())
    ref = _grads(twin, x, y, 1.0)
    idx = [i for i, v in enumerate(model.trainable_variables) if v.path.startswith("d2/")]
    err = np.sqrt(sum(((mixed[i] - ref[i]) ** 2).sum() for i in idx)
                  / sum((ref[i] ** 2).sum() for i in idx))  # fmt: skip
    assert checks[0]["after"] == pytest.approx(err, rel=1e-3, abs=1e-6)


def test_overflow_checks_follow_the_layers_keras_itself_makes_finite():
    from mpwatch.record.probe.fix_check import check_fixes
    from mpwatch.record.probe.probe import Probe

    model = _model("mixed_float16")
    d1 = model.get_layer("d1")
    d1.kernel.assign(np.full(d1.kernel.shape, 0.5, "float32"))  # d1: 8 x 5e4 x 0.5 = 2e5 > 65504
    rng = np.random.default_rng(1)
    x = rng.uniform(4e4, 5e4, size=(16, 8)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    probe = Probe(model)
    payload = probe.run((x, y), scale=1.0)
    assert payload["model"]["first_nonfinite_layer"] == "d1"
    checks = payload["fix_checks"]
    assert checks[0]["fix"] == "none" and checks[0]["first_nonfinite_layer"] == "d1"
    # by hand: which float32 layers give a finite pass (training mode, gradients at the scale),
    # with Keras' own policies; the model's state put back after each
    tried = [c for c in checks if c["fix"] == "float32_layers"]
    assert tried and tried[0]["layers"] == ["d1"]
    for c in tried:
        state = [np.array(v.numpy()) for v in model.non_trainable_variables]
        for name in c["layers"]:
            model.get_layer(name).dtype_policy = "float32"
        try:
            with tf.GradientTape() as tape:
                pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=pred)
            grads = tape.gradient(loss, model.trainable_variables)
            finite = bool(np.isfinite(np.asarray(loss))) and all(
                bool(np.isfinite(np.asarray(g)).all()) for g in grads
            )
        finally:
            for name in c["layers"]:
                model.get_layer(name).dtype_policy = "mixed_float16"
            for v, a in zip(model.non_trainable_variables, state):
                v.assign(a)
        assert c["finite"] == finite, c
    norm = next(c for c in checks if c["fix"] == "normalize_inputs")
    assert norm["finite"]
    assert check_fixes(probe, np.zeros_like(x), y, None, 1.0) == []  # nothing to fix


@keras.saving.register_keras_serializable("mpwatch_tests")
class Block(keras.layers.Layer):
    """A container as the keras.io Transformer's block is: layers of its own, a residual add."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(8, activation="tanh", name="inner")
        self.norm = keras.layers.LayerNormalization(name="norm")

    def call(self, x):
        return self.norm(x + self.inner(x))


def _container_model(policy):
    with _scope(policy):
        keras.utils.set_random_seed(0)
        inp = keras.Input((8,))
        h = keras.layers.Dense(8, name="d1")(inp)
        h = Block(name="blk")(h)
        out = keras.layers.Dense(1, dtype="float32", name="out")(h)
        model = keras.Model(inp, out)
        model.compile("sgd", "mse")
    return model


def test_a_container_is_checked_in_float32_whole():
    """Keeping a layer that holds layers in float32 keeps all of it: switched alone, its float32
    inputs meet its sublayers' float16 outputs in the residual add and TensorFlow fails."""
    from mpwatch.record.probe.fix_check import check_gradient_fixes
    from mpwatch.record.probe.probe import Probe
    from mpwatch.record.probe.twin import PolicyView

    model = _container_model("mixed_float16")
    blk = model.get_layer("blk")
    with PolicyView(model, "float32", only={"blk"}) as view:
        assert {blk.compute_dtype, blk.inner.compute_dtype, blk.norm.compute_dtype} == {"float32"}
        assert model.get_layer("d1").compute_dtype == "float16"
    assert sorted(view.layers) == ["blk", "inner", "norm"]
    assert blk.inner.compute_dtype == "float16"  # restored
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 8)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    scale = 512.0
    probe = Probe(model)
    probe.run((x, y), scale=scale)
    checks = check_gradient_fixes(probe, x, y, None, scale, {"blk": 0.5, "d1": 1e-3, "out": 1e-3})
    assert [c["layer"] for c in checks] == ["blk"] and "error" not in checks[0]
    # by hand: the block and everything in it in float32, the reference a float32 twin
    for sub in blk._flatten_layers():
        sub.dtype_policy = "float32"
    try:
        mixed = _grads(model, x, y, scale)
    finally:
        for sub in blk._flatten_layers():
            sub.dtype_policy = "mixed_float16"
    twin = _container_model("float32")
    twin.set_weights(model.get_weights())
    ref = _grads(twin, x, y, 1.0)
    idx = [i for i, v in enumerate(model.trainable_variables) if v.path.startswith("blk/")]
    assert idx
    err = np.sqrt(sum(((mixed[i] - ref[i]) ** 2).sum() for i in idx)
                  / sum((ref[i] ** 2).sum() for i in idx))  # fmt: skip
    assert checks[0]["after"] == pytest.approx(err, rel=1e-3, abs=1e-6)


def test_a_check_that_cannot_run_is_recorded_and_the_others_still_run(monkeypatch):
    from mpwatch.record.probe import fix_check
    from mpwatch.record.probe.probe import Probe

    model = _model("mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    probe = Probe(model)
    probe.run((x, y), scale=256.0)
    real = fix_check._grads

    def failing(probe_, x_, y_, sw_, scale_, view, key=()):
        if key == ("float32", "d2"):
            raise tf.errors.InvalidArgumentError(None, None, "cannot compute AddV2\nmore")
        return real(probe_, x_, y_, sw_, scale_, view, key)

    monkeypatch.setattr(fix_check, "_grads", failing)
    errors = {"d2": 0.5, "d1": 0.4, "bn": 1e-3, "out": 1e-3}
    checks = fix_check.check_gradient_fixes(probe, x, y, None, 256.0, errors)
    by = {c["layer"]: c for c in checks}
    assert by["d2"]["after"] is None
    assert by["d2"]["error"] == "InvalidArgumentError: cannot compute AddV2"
    assert isinstance(by["d1"]["after"], float) and "error" not in by["d1"]


def _graph(*layers, inputs=None):
    inp = inputs or keras.Input((6, 6, 3))
    h = inp
    for layer in layers:
        h = layer(h)
    return keras.Model(inp, h)


def test_a_model_that_normalizes_its_inputs_itself_is_known_by_its_first_layers():
    from mpwatch.record.model.inputs import normalized_by

    L = keras.layers
    rescale = L.Rescaling(1 / 127.5, offset=-1.0, name="rescale")
    assert normalized_by(_graph(rescale, L.Conv2D(2, 3))) == ["rescale"]
    # through layers that only move values (keras.applications' augmentation, a resize)
    assert normalized_by(
        _graph(L.RandomFlip(name="flip"), L.Resizing(4, 4), L.Normalization(
            mean=0.0, variance=1.0, name="norm"), L.Conv2D(2, 3))
    ) == ["norm"]
    assert normalized_by(_graph(L.BatchNormalization(name="bn"), L.Conv2D(2, 3))) == ["bn"]
    # the inputs reach a computing layer first, or a rescaling that does not scale them down
    assert normalized_by(_graph(L.Conv2D(2, 3), L.Rescaling(1 / 255))) is None
    assert normalized_by(_graph(L.Rescaling(10.0), L.Conv2D(2, 3))) is None
    # every float input must be normalized; an integer input (ids) is not standardized anyway
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    two = keras.Model([a, b], L.Dense(1)(L.Concatenate()([L.Rescaling(0.01)(a), b])))
    assert normalized_by(two) is None
    ids, feats = keras.Input((3,), dtype="int32"), keras.Input((4,))
    h = L.Concatenate()([L.Flatten()(L.Embedding(10, 2)(ids)), L.LayerNormalization()(feats)])
    assert normalized_by(keras.Model([ids, feats], L.Dense(1)(h))) is not None
    seq = keras.Sequential([keras.Input((4,)), L.Rescaling(1 / 255, name="r"), L.Dense(1)])
    assert normalized_by(seq) == ["r"]


def test_keras_applications_preprocessing_is_seen_and_raw_models_are_not():
    from mpwatch.record.model.inputs import normalized_by

    v3 = keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3), classes=2)
    first = normalized_by(v3)
    assert first is not None and type(v3.get_layer(first[0])).__name__ == "Rescaling"
    raw = keras.applications.MobileNetV2(
        weights=None, input_shape=(32, 32, 3), classes=2, alpha=0.35
    )
    assert normalized_by(raw) is None  # it expects inputs in [-1, 1] and does nothing to them


def test_no_input_normalization_is_tried_on_a_model_that_rescales_its_inputs():
    from mpwatch.record.probe.probe import Probe

    with _scope("mixed_float16"):
        keras.utils.set_random_seed(0)
        inp = keras.Input((8,))
        h = keras.layers.Rescaling(1 / 255, name="rescale")(inp)
        h = keras.layers.Dense(32, name="d1")(h)
        out = keras.layers.Dense(1, dtype="float32", name="out")(h)
        model = keras.Model(inp, out)
        model.compile("sgd", "mse")
    d1 = model.get_layer("d1")
    d1.kernel.assign(np.full(d1.kernel.shape, 2e4, "float32"))  # 8 x 1 x 2e4 = 1.6e5 > 65504
    rng = np.random.default_rng(2)
    x = rng.uniform(200, 255, size=(16, 8)).astype("float32")  # pixels as they come
    y = rng.normal(size=(16, 1)).astype("float32")
    # by hand: the model's own rescaling brings the inputs into [0, 1]; the overflow is d1's
    assert float(np.max(np.asarray(model.get_layer("rescale")(x)))) <= 1.0
    payload = Probe(model).run((x, y), scale=1.0)
    assert payload["model"]["first_nonfinite_layer"] == "d1"
    fixes = [c["fix"] for c in payload["fix_checks"]]
    assert "normalize_inputs" not in fixes and "float32_layers" in fixes
