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
    assert "float16" in f.title
    # severity from the measured effect: the quick start's probe finds the 16-bit model's loss
    # within 0.1% of float32's and no step skipped for the model's own overflow (yet): info,
    # said with the measurement; the fix stays, and is applied below
    probe = run.latest_probe(modes=("float16",))
    change = abs(probe.model["loss"] - probe.model["ref_loss"]) / abs(probe.model["ref_loss"])
    assert (f.severity == "info") == (change <= 0.001), (change, f.severity)
    assert f.severity in ("info", "error")
    if f.severity == "info":
        assert f"within {change:.2%} of float32's" in f.evidence
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


def _block_class():
    import keras

    class ResidualBlock(keras.layers.Layer):
        """A container as the keras.io Transformer's block: layers of its own, a residual add."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(4, activation="tanh", name="inner")
            self.norm = keras.layers.LayerNormalization(name="norm")

        def call(self, x):
            return self.norm(x + self.inner(x))

    return ResidualBlock


def _block_model(keras, cls):
    inp = keras.Input((4,))
    x = keras.layers.Dense(4, name="a")(inp)
    x = cls(name="blk")(x)
    out = keras.layers.Dense(2, dtype="float32", name="out")(x)
    model = keras.Model(inp, out)
    model.compile("sgd", "mse")
    return model


def test_a_container_is_kept_in_float32_whole_and_trains(policy):
    """dtype="float32" on a layer that holds layers leaves them in float16 (Keras gives a
    layer's dtype to none of the layers it creates) and TensorFlow fails on the residual add:
    the clone and the snippet switch all of it, and both train."""
    import keras

    cls = _block_class()
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.zeros((8, 2), "float32")
    with policy("mixed_float16"):
        model = _block_model(keras, cls)
        res = mpwatch.apply_recommendations(model, [_keep("blk")])
        blk = res.model.get_layer("blk")
        assert [sub.compute_dtype for sub in (blk, blk.inner, blk.norm)] == ["float32"] * 3
        assert res.model.get_layer("a").compute_dtype == "float16"
        assert model.get_layer("blk").inner.compute_dtype == "float16"  # original untouched
        res.model.fit(x, y, epochs=1, verbose=0)  # it trains
        assert res.policy_map[model.get_layer("blk").inner.path].name == "float32"
        # the snippet, run on a freshly built model, gives the same policies and trains
        fresh = _block_model(keras, cls)
        assert "._flatten_layers():" in res.after_build
        exec(res.after_build, {"model": fresh, "keras": keras})  # noqa: S102
        got = fresh.get_layer("blk")
        assert [sub.compute_dtype for sub in (got, got.inner, got.norm)] == ["float32"] * 3
        fresh.fit(x, y, epochs=1, verbose=0)
        # the layer alone in float32, as dtype="float32" where it is created does: it fails
        alone = _block_model(keras, cls)
        alone.get_layer("blk").dtype_policy = "float32"
        with pytest.raises(Exception, match="AddV2|float16|half"):
            alone.fit(x, y, epochs=1, verbose=0)


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
        after = _underflow(keras, res.model, *batch,
                           res.loss_scale if res.loss_scale is not None else scale)  # fmt: skip
        predicted = advice.data["underflow_with_layers_float32"]
        assert after < before / 10
        assert after == pytest.approx(predicted, abs=0.005)


# --- the fixed model trains as the snippet says (issue 24, item 6) --------------------------------
# Ground truth from Keras itself: the snippet's code run on a freshly built model gives the layer
# policies Keras reports for the fixed model; the optimizers' variables are compared by identity
# and value; the original's state is snapshotted before the fixed model trains and after.
SCALE = Finding("loss-scale", "warning", "t", "e", action={"loss_scale": 4096.0})


def _build(keras, final_dtype=None):
    """A small two-layer Functional model, layer names explicit (a fresh build names them so)."""
    inp = keras.Input((4,), name="x")
    h = keras.layers.Dense(8, activation="relu", name="hidden")(inp)
    out = keras.layers.Dense(3, activation="softmax", name="probs", dtype=final_dtype)(h)
    return keras.Model(inp, out, name="classifier")


def _policies(model):
    """[(name, class, policy)] of the model and every layer under it, in order."""
    out = [(model.name, type(model).__name__, model.dtype_policy.name)]

    def rec(layer):
        for sub in getattr(layer, "layers", None) or []:
            out.append((sub.name, type(sub).__name__, sub.dtype_policy.name))
            rec(sub)

    rec(model)
    return out


def _state(model):
    """Every weight and optimizer variable (and metric variable) of a model, as numpy."""
    values = [np.array(v) for v in model.weights]
    values += [np.array(v) for v in model.optimizer.variables]
    values += [np.array(v) for v in model.metrics_variables]
    return values


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _data(n=16):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype("float32"), rng.integers(0, 3, n)


def _run_snippet(keras, res, build, optimizer):
    """The snippet, as code: its parts run around a fresh build; returns (model, optimizer).
    The caller restores the global policy (the snippet may set it)."""
    compile(res.snippet, "<snippet>", "exec")  # the whole snippet is Python
    for part in (res.before_build, res.after_build):
        assert part in res.snippet
    scope = {"keras": keras, "optimizer": optimizer}
    exec(res.before_build, scope)
    scope["model"] = build()
    exec(res.after_build, scope)
    return scope["model"], scope["optimizer"]


def _variable_ids(optimizer):
    ids = {id(v) for v in optimizer.variables}
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        ids |= {id(v) for v in inner.variables}
    return ids


def test_the_fixed_model_is_compiled_with_a_new_optimizer_at_the_recommended_scale(policy):
    import keras

    x, y = _data()
    with policy("mixed_float16"):
        keras.utils.set_random_seed(0)
        model = _build(keras)
        model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])  # fmt: skip
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the original has optimizer state
        original = model.optimizer
        res = mpwatch.apply_recommendations(model, [_keep("probs"), SCALE])
        fixed = res.model
        opt = fixed.optimizer
        # compiled, with a new LossScaleOptimizer at the recommended scale, shared with nothing
        assert fixed.compiled and opt is res.optimizer
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        assert opt is not original and opt.inner_optimizer is not original.inner_optimizer
        assert not _variable_ids(opt) & _variable_ids(original)
        assert opt.initial_scale == 4096.0 == res.loss_scale
        assert float(np.asarray(opt.dynamic_scale)) == 4096.0  # built: the scale it starts at
        assert int(np.asarray(opt.iterations)) == 0 < int(np.asarray(original.iterations))
        assert isinstance(opt.inner_optimizer, keras.optimizers.Adam)
        assert float(np.asarray(opt.inner_optimizer.learning_rate)) == pytest.approx(3e-3)
        assert float(np.asarray(original.dynamic_scale)) == 32768.0  # the original's is its own
        # training the fixed model changes nothing of the original's
        before = _state(model)
        fixed_before = [np.array(v) for v in fixed.weights]
        history = fixed.fit(x, y, batch_size=8, epochs=1, verbose=0)
        assert set(history.history) == {"loss", "accuracy"}  # compiled as the original was
        assert _same(_state(model), before)
        assert not _same([np.array(v) for v in fixed.weights], fixed_before)  # it trained
        assert int(np.asarray(opt.iterations)) == 2
        # the snippet, run on a fresh model: the same layer policies and the same optimizer
        fresh, from_snippet = _run_snippet(
            keras, res, lambda: _build(keras), keras.optimizers.Adam(3e-3)
        )
    assert _policies(fresh) == _policies(fixed)
    assert dict((n, p) for n, _, p in _policies(fixed))["probs"] == "float32"
    assert (from_snippet.initial_scale, from_snippet.dynamic_growth_steps) == (
        opt.initial_scale, opt.dynamic_growth_steps
    )  # fmt: skip


def test_without_scale_advice_the_new_optimizer_scales_as_the_original_did(policy):
    import keras

    with policy("mixed_float16"):
        model = _build(keras)
        mine = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=256.0, dynamic_growth_steps=50
        )
        model.compile(mine, "sparse_categorical_crossentropy")
        res = mpwatch.apply_recommendations(model, [_keep("probs")])
        opt = res.model.optimizer
        assert opt is res.optimizer and opt is not mine
        assert opt.inner_optimizer is not mine.inner_optimizer
        assert (opt.initial_scale, opt.dynamic_growth_steps) == (256.0, 50)
        assert not _variable_ids(opt) & _variable_ids(mine)
        # the model's own optimizer passed as the one to use: copied, never shared
        res = mpwatch.apply_recommendations(model, [SCALE], optimizer=mine)
        assert res.optimizer.inner_optimizer is not mine.inner_optimizer
        assert not _variable_ids(res.optimizer) & _variable_ids(mine)
        assert res.optimizer.initial_scale == 4096.0
        # a model that was not compiled gives a clone that is not compiled
        res = mpwatch.apply_recommendations(_build(keras), [_keep("probs"), SCALE])
        assert not res.model.compiled and res.optimizer is None


def test_one_policy_the_advice_moot_under_it_left_out(policy):
    """A finding says float32 for the whole model (this device), others keep a layer in
    float32 and set a loss scale (the model): one coherent change, whatever the order: the
    model's advice, under its mixed policy, and a note for the device's float32 left out."""
    import keras

    to_float32 = Finding("no-tensor-cores", "warning", "t", "e", action={"policy": "float32"})
    with policy("mixed_float16"):
        model = _build(keras)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        res = mpwatch.apply_recommendations(model, [to_float32, _keep("probs"), SCALE])
        fixed = res.model
        assert res.policy == "mixed_float16" and res.layers == ["probs"]
        assert res.loss_scale == SCALE.action["loss_scale"]
        assert len(res.notes) == 1 and "no-tensor-cores" in res.notes[0]
        code = [ln for ln in res.snippet.splitlines() if not ln.lstrip().startswith("#")]
        assert not [ln for ln in code if "set_global_policy" in ln]
        assert dict((n, p) for n, _, p in _policies(fixed))["probs"] == "float32"
        opt = fixed.optimizer
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        assert opt.inner_optimizer is not model.optimizer.inner_optimizer
        assert res.policy_map.default_policy.name == "mixed_float16"
        assert keras.mixed_precision.global_policy().name == "mixed_float16"  # restored
        fresh, _ = _run_snippet(keras, res, lambda: _build(keras), keras.optimizers.Adam())
        x, y = _data()
        fixed.fit(x, y, batch_size=8, verbose=0)
    assert _policies(fresh) == _policies(fixed)


def test_pure_float16_becomes_mixed_float16_with_float32_variables(policy):
    """The train-step finding's fix for the pure float16 policy: the clone is built under
    mixed_float16 (float32 variables, the weights cast), the output kept in float32, and Keras
    wraps the new optimizer in its LossScaleOptimizer."""
    import keras

    use_mixed = Finding("train-step", "error", "t", "e", action={"policy": "mixed_float16"})
    with policy("float16"):
        model = _build(keras)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        res = mpwatch.apply_recommendations(model, [use_mixed, _keep("probs")])
        fixed = res.model
        assert {v.dtype for v in model.weights} == {"float16"}
        assert {v.dtype for v in fixed.weights} == {"float32"}
        for a, b in zip(model.get_weights(), fixed.get_weights()):
            assert np.array_equal(a.astype(np.float32), b)
        assert isinstance(fixed.optimizer, keras.optimizers.LossScaleOptimizer)
        assert fixed.optimizer.inner_optimizer is not model.optimizer
        fresh, _ = _run_snippet(keras, res, lambda: _build(keras), keras.optimizers.Adam())
    pol = dict((n, p) for n, _, p in _policies(fixed))
    assert pol["classifier"] == pol["hidden"] == "mixed_float16" and pol["probs"] == "float32"
    assert _policies(fresh) == _policies(fixed)


def test_a_layer_the_user_pinned_keeps_its_policy(policy):
    """A mixed model whose output the user pinned to float32, advised mixed_bfloat16: building
    it under the snippet's global policy leaves the pinned layer as it is, so does the clone."""
    import keras

    to_bf16 = Finding("try-mixed-precision", "info", "t", "e",
                      action={"policy": "mixed_bfloat16"})  # fmt: skip
    with policy("mixed_float16"):
        model = _build(keras, final_dtype="float32")
        res = mpwatch.apply_recommendations(model, [to_bf16])
        fresh, _ = _run_snippet(keras, res, lambda: _build(keras, "float32"), None)
    pol = dict((n, p) for n, _, p in _policies(res.model))
    assert pol["classifier"] == pol["hidden"] == "mixed_bfloat16" and pol["probs"] == "float32"
    assert _policies(fresh) == _policies(res.model)


def test_a_custom_loss_and_metric_instances_are_compiled_again(policy):
    """Keras' clone_model compiles from the serialized config, which fails on an unregistered
    loss function; the fixed model is compiled with the arguments as given, metrics new."""
    import keras

    def my_loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - keras.ops.cast(y_pred, "float32")))

    with policy("mixed_float16"):
        inp = keras.Input((4,))
        model = keras.Model(inp, keras.layers.Dense(2, dtype="float32", name="out")(inp))
        mae = keras.metrics.MeanAbsoluteError()
        model.compile(keras.optimizers.SGD(0.01), my_loss, metrics=[mae])
        x = np.ones((8, 4), np.float32)
        y = np.zeros((8, 2), np.float32)
        model.evaluate(x, y, verbose=0)
        before = [np.array(v) for v in mae.variables]
        res = mpwatch.apply_recommendations(model, [SCALE])
        history = res.model.fit(x, y, batch_size=8, verbose=0)
    assert set(history.history) == {"loss", "mean_absolute_error"}
    assert _same([np.array(v) for v in mae.variables], before)
    assert res.model.optimizer.initial_scale == 4096.0


def test_the_order_of_the_findings_does_not_decide(policy):
    """A fix that keeps mixed precision (a layer in float32: about the model) and a policy that
    leaves it (float32 on this device): in either order the fix is applied and the policy left
    out with a note (it depended on the order: one model turned float32 whole, another kept its
    layer fixes). Alone, the device's policy is applied."""
    import keras

    on_cpu = Finding("no-tensor-cores", "warning", "t", "e", action={"policy": "float32"})
    with policy("mixed_float16"):
        model = _build(keras)
        keep_first = mpwatch.apply_recommendations(model, [_keep("probs"), on_cpu])
        policy_first = mpwatch.apply_recommendations(model, [on_cpu, _keep("probs")])
        alone = mpwatch.apply_recommendations(model, [on_cpu])
    for res in (keep_first, policy_first):
        assert res.policy == "mixed_float16" and res.layers == ["probs"]
        assert res.before_build == "" and "set_global_policy" not in "\n".join(
            ln for ln in res.snippet.splitlines() if not ln.startswith("#")
        )
        assert res.notes == [
            'no-tensor-cores\'s set_global_policy("float32") left out: output-16bit keep mixed '
            "precision (their fixes are applied)"
        ]
        assert _policies(res.model) == _policies(keep_first.model)
    assert alone.policy == "float32"
    assert {p for _, _, p in _policies(alone.model)} == {"float32"}


def test_an_adapted_normalization_in_float32_keeps_its_mean_and_variance(policy):
    """Keras casts an adapted Normalization's mean and variance when it is adapted or loaded, not
    when its policy changes: the clone (weights copied) and the snippet (policy set on the built
    model) both give numpy's float64 standardization of features float16 cannot hold."""
    import keras

    rng = np.random.default_rng(4)
    data = np.stack([rng.uniform(500, 5000, 256), rng.uniform(1e4, 3e5, 256)], 1)
    want = (data[:16] - data.mean(axis=0)) / data.std(axis=0)

    def build():
        norm = keras.layers.Normalization(name="normalization")
        norm.adapt(data.astype("float32"))
        inp = keras.Input((2,))
        return keras.Model(inp, keras.layers.Dense(1, dtype="float32", name="out")(norm(inp)))

    with policy("mixed_float16"):
        model = build()
        res = mpwatch.apply_recommendations(model, [_keep("normalization")])
        again = build()
    x = data[:16].astype("float32")
    assert not np.isfinite(np.asarray(model.get_layer("normalization")(x))).all()
    got = np.asarray(res.model.get_layer("normalization")(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert 'model.get_layer("normalization").finalize_state()' in res.snippet
    exec(res.after_build, {"model": again})  # noqa: S102  (the snippet, as written)
    got = np.asarray(again.get_layer("normalization")(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_pre_flight_layer_advice_is_applied_with_the_policy_it_is_for(policy):
    """A float32 model's pre-flight probe saw 'hidden' overflow float16: "when you switch to
    mixed_float16, keep 'hidden' float32". Applied with try-mixed-precision's switch, the model
    gets both; applied alone, the model stays float32 (the layer advice is moot there)."""
    import keras

    with policy("float32"):
        inp = keras.Input((4,))
        x = keras.layers.Dense(8, name="hidden")(inp)
        model = keras.Model(inp, keras.layers.Dense(1, name="head")(x))
    switch = Finding("try-mixed-precision", "info", "t", "e", action={"policy": "mixed_float16"})
    pre = Finding("activation-overflow", "info", "t", "e", layer="hidden",
                  action={"dtype": "float32"})  # fmt: skip
    both = mpwatch.apply_recommendations(model, [switch, pre])
    pol = {layer.name: layer.dtype_policy.name for layer in both.model.layers[1:]}
    assert both.policy == "mixed_float16" and pol == {"hidden": "float32", "head": "mixed_float16"}
    alone = mpwatch.apply_recommendations(model, [pre])
    assert {layer.dtype_policy.name for layer in alone.model.layers[1:]} == {"float32"}


def test_a_functional_model_with_a_lambda_is_cloned_and_keeps_its_function(policy):
    """Keras' safe mode refuses to rebuild a Lambda's Python function from a config (a file's
    risk); the clone is made in memory from the user's own objects. It failed, saying the
    Functional model was subclassed."""
    import keras

    with policy("mixed_float16"):
        inp = keras.Input((4,))
        x = keras.layers.Dense(8, name="d1")(inp)
        x = keras.layers.Lambda(lambda t: t * 2.0, name="double")(x)
        model = keras.Model(inp, keras.layers.Dense(1, dtype="float32", name="out")(x))
    got = mpwatch.apply_recommendations(model, [_keep("d1")])
    assert got.model.get_layer("d1").dtype_policy.name == "float32"
    x = np.ones((2, 4), "float32")
    np.testing.assert_allclose(np.asarray(got.model(x)), np.asarray(model(x), "float32"),
                               rtol=1e-2, atol=1e-2)  # fmt: skip


def _user_layers():
    """Layers written as keras.io's examples write them: a function defined in a script (Keras
    cannot find it again by name), an __init__ without **kwargs whose get_config leaves out the
    name (the Transformer's TokenAndPositionEmbedding), a get_config that leaves out an argument
    (the ViT's PatchEncoder), a constructor given an object no config holds."""
    import keras

    script = {"__name__": "a_users_script"}  # not importable: as a script run with python
    exec("def twice(t):\n    return t * 2.0\n", script)  # noqa: S102

    class Scale(keras.layers.Layer):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor
            self.inner = keras.layers.Dense(8, name=None)

        def call(self, x):
            return self.inner(x) * self.factor

        def get_config(self):
            return {"factor": self.factor, "trainable": self.trainable, "dtype": self.dtype_policy}

    class Shift(keras.layers.Layer):
        def __init__(self, units, shift, **kwargs):
            super().__init__(**kwargs)
            self.units, self.shift = units, shift

        def call(self, x):
            return x + self.shift

        def get_config(self):
            return {**super().get_config(), "units": self.units}  # shift left out

    class Table:  # not a value a config can hold
        offset = 0.25

    class Lookup(keras.layers.Layer):
        def __init__(self, table, **kwargs):
            super().__init__(**kwargs)
            self.table = table

        def call(self, x):
            return x + self.table.offset

    return script["twice"], Scale, Shift, Lookup, Table


def test_a_users_layers_are_cloned_as_their_code_makes_them(policy):
    """Each of the three, in one Functional model, with another layer's fix applied: the clone's
    layers have the original's names (its inputs too: Keras names them keras_tensor) and
    policies, the fixed layer is float32, and the output is the original's (numpy: the same
    weights, the same function); a layer is made with the arguments its constructor was called
    with, and one nothing can rebuild is shared, with a note. keras.io's Siamese network,
    Transformer and ViT each failed to clone."""
    import keras

    twice, Scale, Shift, Lookup, Table = _user_layers()
    with policy("mixed_float16"):
        inp = keras.Input((4,), name="features")
        x = keras.layers.Dense(8, name="d1")(inp)
        x = keras.layers.Lambda(twice, name="double")(x)
        x = Scale(0.5)(x)
        x = Shift(8, 1.0, name="shift")(x)
        x = Lookup(Table(), name="lookup")(x)
        model = keras.Model(inp, keras.layers.Dense(1, dtype="float32", name="out")(x))
    got = mpwatch.apply_recommendations(model, [_keep("d1")])
    new = got.model
    assert [ly.name for ly in new.layers] == [ly.name for ly in model.layers]
    assert {ly.name: ly.dtype_policy.name for ly in new.layers} == {
        **{ly.name: ly.dtype_policy.name for ly in model.layers}, "d1": "float32"}  # fmt: skip
    assert new.get_layer("shift") is not model.get_layer("shift")  # its constructor's arguments
    assert new.get_layer("shift").shift == 1.0
    assert new.get_layer("lookup") is model.get_layer("lookup")  # shared: nothing rebuilds it
    assert any("Lookup 'lookup' cannot be rebuilt" in n and "shares it" in n for n in got.notes)
    assert new.get_layer("double").function is twice
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    w = {ly.name: [np.asarray(v, "float64") for v in ly.get_weights()] for ly in model.layers}
    h = x @ w["d1"][0] + w["d1"][1]
    inner = next(ly for ly in model._flatten_layers() if type(ly).__name__ == "Dense"
                 and ly.name not in ("d1", "out"))  # fmt: skip
    iw = [np.asarray(v, "float64") for v in inner.get_weights()]
    h = ((2.0 * h) @ iw[0] + iw[1]) * 0.5 + 1.0 + 0.25
    want = h @ w["out"][0] + w["out"][1]
    np.testing.assert_allclose(np.asarray(new(x), "float64"), want, rtol=2e-2, atol=2e-2)


def test_a_policy_change_reaches_the_layers_a_wrapper_holds(policy):
    """keras.io's bidirectional LSTM under mixed_float16, advised float32 (a CPU): the clone
    must be the model its code builds under float32, every layer in it float32; a Bidirectional
    rebuilds its LSTMs from their own configs, and they stayed mixed_float16."""
    import keras

    def build():
        inp = keras.Input((6,), dtype="int32")
        x = keras.layers.Embedding(50, 8)(inp)
        x = keras.layers.Bidirectional(keras.layers.LSTM(4))(x)
        return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))

    to_float32 = Finding("no-tensor-cores", "warning", "t", "e", action={"policy": "float32"})
    with policy("mixed_float16"):
        model = build()
    with policy("float32"):
        truth = build()  # the user's code under the advised policy
    got = mpwatch.apply_recommendations(model, [to_float32]).model

    def every(m):
        return [(type(ly).__name__, ly.dtype_policy.name) for ly in m._flatten_layers()]

    assert every(got) == every(truth)
    assert {p for _, p in every(got)} == {"float32"}


def test_a_layer_the_fix_changes_is_never_shared_as_it_was(policy):
    """A layer nothing can rebuild (made with an object no config holds) that a finding keeps
    in float32: sharing it as it is would drop the fix; the clear error says to change the code."""
    import keras

    _, _, _, Lookup, Table = _user_layers()
    with policy("mixed_float16"):
        inp = keras.Input((4,))
        x = Lookup(Table(), name="lookup")(keras.layers.Dense(4, name="d1")(inp))
        model = keras.Model(inp, keras.layers.Dense(1, dtype="float32", name="out")(x))
    with pytest.raises(ValueError, match="cannot clone Functional layer by layer"):
        mpwatch.apply_recommendations(model, [_keep("lookup")])
