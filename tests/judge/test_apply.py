"""apply_recommendations, and the acceptance test of the diagnosis on the quick start's real run."""

from __future__ import annotations

import numpy as np
import pytest
from repo_scripts import load_script

import mpwatch
from mpwatch.judge import Finding


def _keep(name, output=False):
    action = {"dtype": "float32", **({"output": True} if output else {})}
    return Finding("output-16bit", "error", "t", "e", layer=name, action=action)


def test_functional_clone_weights_policy_map_snippet(policy):
    import keras

    with policy("mixed_float16"):
        inp = keras.Input((4,))
        x = keras.layers.Dense(8, name="hidden")(inp)
        out = keras.layers.Dense(3, activation="softmax", name="probs")(x)
        model = keras.Model(inp, out)
        scale = Finding("loss-scale", "warning", "t", "e", action={"loss_scale": 4096.0})
        res = mpwatch.apply_recommendations(model, [_keep("probs"), scale, _keep("nothere")])
    clone = res.model
    assert clone is not model
    pol = {layer.name: layer.dtype_policy.name for layer in clone.layers}
    assert pol["probs"] == "float32" and pol["hidden"] == "mixed_float16"
    assert model.get_layer("probs").dtype_policy.name == "mixed_float16"  # original untouched
    for a, b in zip(model.get_weights(), clone.get_weights()):
        np.testing.assert_array_equal(a, b)
    x = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    assert clone(x).dtype == "float32"
    np.testing.assert_allclose(np.asarray(clone(x)), np.asarray(model(x), dtype="float32"),
                               atol=2e-3)  # fmt: skip
    assert res.layers == ["probs"] and res.loss_scale == 4096.0
    assert res.skipped == {"nothere": "no layer of that name in this model"}
    assert res.policy_map[model.get_layer("probs").path].name == "float32"
    assert res.policy_map["elsewhere/dense"].name == "mixed_float16"  # the default
    assert 'name="probs", dtype="float32"' in res.snippet
    assert "initial_scale=4096" in res.snippet


def test_advice_without_a_model():
    res = mpwatch.apply_recommendations(None, [_keep("probs")])
    assert res.model is None and res.layers == ["probs"]
    assert res.policy_map["probs"].name == "float32"


def test_output_finding_follows_the_output_of_another_instance(policy):
    import keras

    with policy("mixed_float16"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="last_one")])
        res = mpwatch.apply_recommendations(model, [_keep("dense_99", output=True)])
    assert res.layers == ["last_one"]
    assert res.model.layers[-1].dtype_policy.name == "float32"


@pytest.mark.slow
def test_quickstart_diagnosis_names_the_float16_softmax_and_the_fix_trains(
    quickstart_logdir, policy, tmp_path
):
    findings = mpwatch.diagnose(quickstart_logdir)
    out = [f for f in findings if f.rule == "output-16bit"]
    assert len(out) == 1, [f.title for f in findings]
    (f,) = out
    run = mpwatch.load_run(quickstart_logdir)
    last = run.layers[run.layers["is_output"].astype(bool)].iloc[-1]
    assert f.layer == last["name"] and last["class"] == "Dense"
    assert f.severity == "error" and "float16" in f.title
    assert 'dtype="float32"' in f.fix

    import keras

    qs = load_script("examples/quickstart.py")
    with policy("mixed_float16"):
        model = qs.build_model()
        res = mpwatch.apply_recommendations(model, findings)
        clone = res.model
        assert clone.layers[-1].dtype_policy.name == "float32"
        for a, b in zip(model.get_weights(), clone.get_weights()):
            np.testing.assert_array_equal(a, b)
        clone.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy")  # fmt: skip
        x, y = qs.synthetic_mnist(128)
        logdir = str(tmp_path / "fixed")
        monitor = mpwatch.MixedPrecisionMonitor(log_dir=logdir, log_every=1)
        hist = clone.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[monitor])
    assert np.isfinite(hist.history["loss"][-1])
    assert clone.predict(x[:4], verbose=0).dtype == np.float32
    again = mpwatch.diagnose(logdir)
    assert mpwatch.load_run(logdir).has_data
    assert [g for g in again if g.rule == "output-16bit"] == []


# --- the loss-scale advice, applied: what the snippet says is what the optimizer is -------------
def test_the_builders_dynamic_rule_is_keras_own():
    """keras_scale_history (the tests' model of the dynamic scale) against Keras'
    LossScaleOptimizer on the same sequence of finite and non-finite gradients."""
    import keras
    from builders import keras_scale_history

    bad = {2, 9, 10, 17}
    v = keras.Variable(np.zeros(3, np.float32))
    opt = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0**5, dynamic_growth_steps=3
    )
    opt.build([v])
    got = {}
    for s in range(1, 21):
        opt.apply([np.full(3, np.inf if s in bad else 1.0, np.float32)], [v])
        got[s] = float(opt.dynamic_scale.numpy())
    scales, skipped = keras_scale_history(20, lambda s, S: s in bad, initial=2.0**5, growth=3)
    assert got == {s: scales[s] for s in range(1, 21)}
    assert int(opt.iterations.numpy()) == 20 - len(bad) == 20 - sum(skipped.values())


def _advice_findings(kind):
    """Findings of a constructed run whose advice proposes an initial scale ("initial") or only a
    faster growth ("growth")."""
    from builders import grad_probe, keras_scale_history, log_uniform, scale_run

    if kind == "initial":
        scales, skipped = keras_scale_history(400, lambda s, S: False)
        g, step = log_uniform(-45, -13), 400
    else:  # 9 skips at the start to 64, then gradients that need 2^14
        scales, skipped = keras_scale_history(30, lambda s, S: s <= 9)
        g, step = log_uniform(-38, -8), 30
    run = scale_run([grad_probe(step, {"dense": g}, scales[step])], scales, skipped)
    from mpwatch.judge.rules import loss_scale

    found = mpwatch.diagnose(run)
    (f,) = loss_scale.check(run)  # diagnose may fold it into gradient-underflow (same action)
    assert f in found or any(g.action == f.action for g in found)
    return found, f


def _snippet_optimizer(snippet, inner):
    import keras

    (line,) = [x for x in snippet.splitlines() if x.startswith("optimizer = ")]
    scope = {"keras": keras, "optimizer": inner}
    exec(line, scope)
    return scope["optimizer"]


@pytest.mark.parametrize("kind", ["initial", "growth"])
def test_applied_optimizer_is_what_the_finding_and_the_snippet_say(policy, kind):
    import keras

    findings, f = _advice_findings(kind)
    want_scale = f.data["initial_scale"] or f.data["run_initial_scale"]
    want_growth = f.data["dynamic_growth_steps"] or f.data["run_dynamic_growth_steps"]
    if kind == "initial":
        assert f.data["initial_scale"] > 2.0**15 and f.data["dynamic_growth_steps"] is None
    else:
        assert f.data["initial_scale"] is None and f.data["dynamic_growth_steps"] < 2000
    with policy("mixed_float16"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="dense")])
        model.compile(optimizer=keras.optimizers.Adam(3e-4), loss="mse")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        res = mpwatch.apply_recommendations(model, findings)
        opt = res.optimizer
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        assert opt is not model.optimizer and opt.inner_optimizer is not model.optimizer
        assert isinstance(opt.inner_optimizer, keras.optimizers.Adam)
        assert float(opt.inner_optimizer.learning_rate) == pytest.approx(3e-4)
        assert (opt.initial_scale, opt.dynamic_growth_steps) == (want_scale, want_growth)
        action = (f.action["loss_scale"], f.action["dynamic_growth_steps"])
        assert (res.loss_scale, res.dynamic_growth_steps) == action
        # the snippet's line, run on the same kind of inner optimizer, builds the same optimizer
        from_snippet = _snippet_optimizer(res.snippet, keras.optimizers.Adam(3e-4))
        assert (from_snippet.initial_scale, from_snippet.dynamic_growth_steps) == (
            want_scale, want_growth
        )  # fmt: skip
        if kind == "growth":
            assert "initial_scale" not in res.snippet  # never Keras' default: a no-op
        # the finding's printed fix and the applied snippet carry the same optimizer line
        (fix_line,) = [x for x in f.fix.splitlines() if x.startswith("optimizer = ")]
        assert fix_line in res.snippet.splitlines()
        # compiled and trained one step: Keras keeps the optimizer and starts at its scale
        clone = res.model
        clone.compile(optimizer=opt, loss="mse")
        assert clone.optimizer is opt
        opt.build(clone.trainable_variables)
        assert float(opt.dynamic_scale.numpy()) == want_scale
        x = np.ones((4, 4), np.float32)
        clone.fit(x, np.zeros((4, 2), np.float32), batch_size=4, epochs=1, verbose=0)
        assert int(opt.iterations.numpy()) == 1
        assert float(opt.dynamic_scale.numpy()) == want_scale  # one finite step: unchanged


def test_apply_wraps_the_optimizer_given():
    import keras

    findings, f = _advice_findings("initial")
    mine = keras.optimizers.SGD(0.01)
    res = mpwatch.apply_recommendations(None, findings, optimizer=mine)
    assert res.model is None and res.optimizer.inner_optimizer is mine
    assert res.optimizer.initial_scale == f.data["initial_scale"]
    # a LossScaleOptimizer given: its inner optimizer is wrapped, not the wrapper
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    res = mpwatch.apply_recommendations(None, findings, optimizer=lso)
    assert res.optimizer.inner_optimizer is lso.inner_optimizer


def test_no_loss_scale_advice_no_optimizer():
    res = mpwatch.apply_recommendations(None, [_keep("probs")])
    assert res.optimizer is None and "LossScaleOptimizer" not in res.snippet


def test_a_findings_layer_list_is_applied(policy):
    import keras

    grouped = Finding("gradient-underflow", "warning", "t", "e",
                      action={"float32_layers": ["a", "b"]})  # fmt: skip
    with policy("mixed_float16"):
        inp = keras.Input((4,))
        x = keras.layers.Dense(4, name="a")(inp)
        x = keras.layers.Dense(4, name="b")(x)
        out = keras.layers.Dense(4, name="c")(x)
        res = mpwatch.apply_recommendations(keras.Model(inp, out), [grouped])
    pol = {layer.name: layer.dtype_policy.name for layer in res.model.layers}
    assert pol["a"] == pol["b"] == "float32" and pol["c"] == "mixed_float16"
    assert res.layers == ["a", "b"]


# --- a real deep sigmoid MLP: the advice, applied, loses less (checked in the test itself) ------
def _sigmoid_mlp(keras, depth=22, width=32):
    layers = [keras.Input((16,))]
    layers += [keras.layers.Dense(width, activation="sigmoid", name=f"d{i}") for i in range(depth)]
    layers += [keras.layers.Dense(10, name="logits"),
               keras.layers.Activation("softmax", dtype="float32", name="probs")]  # fmt: skip
    return keras.Sequential(layers)


def _underflow(keras, model, x, y, scale):
    """Measured here: among the float32 reference's nonzero weight gradients (the same weights
    under a float32 policy, training mode), the share that are zero in ``model``'s gradient of
    ``loss * scale``."""
    import tensorflow as tf

    def as_float32(layer):
        config = layer.get_config()
        config["dtype"] = "float32"
        return layer.__class__.from_config(config)

    ref_model = keras.models.clone_model(model, clone_function=as_float32)
    ref_model.set_weights(model.get_weights())
    loss = keras.losses.SparseCategoricalCrossentropy()

    def grads(m, s):
        with tf.GradientTape() as tape:
            value = loss(y, m(x, training=True)) * s
        return [np.asarray(g, np.float64) for g in tape.gradient(value, m.trainable_variables)]

    ref, got = grads(ref_model, 1.0), grads(model, scale)
    nonzero = sum(int((r != 0).sum()) for r in ref)
    lost = sum(int(((r != 0) & (g == 0)).sum()) for r, g in zip(ref, got))
    return lost / nonzero


@pytest.mark.slow
def test_deep_sigmoid_mlp_advice_is_predicted_and_verified_to_lose_less(policy, tmp_path):
    import keras

    with policy("mixed_float16"):
        keras.utils.set_random_seed(0)
        model = _sigmoid_mlp(keras)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        rng = np.random.default_rng(0)
        x = rng.normal(size=(640, 16)).astype("float32")
        y = rng.integers(0, 10, size=640)
        logdir = str(tmp_path / "mlp")
        monitor = mpwatch.MixedPrecisionMonitor(
            log_dir=logdir, log_every=5, probe_every=10, profile=False
        )
        model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
        scale = float(model.optimizer.dynamic_scale.numpy())
        batch = (x[:64], y[:64])  # the probe's batch: the first training batch
        before = _underflow(keras, model, *batch, scale)
        findings = mpwatch.diagnose(logdir)
        (under,) = [f for f in findings if f.rule == "gradient-underflow"]
        from mpwatch.judge.rules import loss_scale

        (advice,) = loss_scale.check(mpwatch.load_run(logdir))
        assert "loss-scale" in under.data["also"]  # one finding for the one cause
        # underflow found, and the probe's figure is the one measured here
        assert before > 0.1
        assert under.data["underflow_fraction"] == pytest.approx(before, abs=1e-3)
        assert under.severity == "error" and advice.data["scale_used"] == scale
        # never a lower scale (the probe's margin allows no larger one here)
        proposed = advice.data["initial_scale"]
        assert proposed is None or proposed > scale
        # the advice, applied, loses less: as predicted (an estimate), and far less than before
        keep = advice.action["float32_layers"]
        assert keep and under.action == advice.action
        res = mpwatch.apply_recommendations(model, findings)
        assert res.layers == keep
        after = _underflow(keras, res.model, *batch, res.optimizer.initial_scale
                           if res.optimizer is not None else scale)  # fmt: skip
        predicted = advice.data["underflow_with_layers_float32"]
        assert after < before / 10
        assert after == pytest.approx(predicted, abs=0.005)
