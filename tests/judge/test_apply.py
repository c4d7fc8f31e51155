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
