"""The pre-flight (issue 53) against what training then does, on models of ``examples/
real_models.py`` built under float32: its predictions checked by short fits under the candidate
(the optimizer's own iterations and scale, numpy's underflow count of the train step's own
gradients), its recommendation applied with ``apply_recommendations`` and trained (the problem
gone), the printed code naming what is applied, and the model left as it was.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from repo_scripts import load_script

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import mpwatch  # noqa: E402
from mpwatch.judge.fixes.fix import printed_layers  # noqa: E402
from mpwatch.launch.report import recommendation_code  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rm():
    return load_script("examples/real_models.py")


@pytest.fixture(scope="module")
def flown(rm, tmp_path_factory):
    """name -> (float32 model, batch, weights before, report): each pre-flown once."""
    cache = {}

    def get(name):
        if name not in cache:
            keras.backend.clear_session()
            model, x, y = rm.build(name, policy="float32")
            bs = rm.BATCH_SIZES[name]
            batch = (x[:bs], y[:bs])
            before = [w.copy() for w in model.get_weights()]
            logdir = str(tmp_path_factory.mktemp(f"pre_{name}"))
            cache[name] = (model, batch, before, mpwatch.preflight(model, batch, log_dir=logdir))
        return cache[name]

    return get


def _fit(model, batch, steps=4):
    x, y = batch
    idx = np.arange(steps * len(x)) % len(x)
    history = model.fit(x[idx], y[idx], batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return history.history["loss"][-1]


def _under(policy, rm, name, model):
    """The same network built under ``policy`` with the float32 model's weights."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        other, _, _ = rm.SCENARIOS[name]()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    other.set_weights(model.get_weights())
    return other


def test_the_model_is_left_as_it_was(flown):
    model, _, before, report = flown("logsumexp")
    assert {ly.dtype_policy.name for ly in model.layers} == {"float32"}
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert report.log_dir and {c.policy for c in report.candidates} == {
        "mixed_float16", "mixed_bfloat16",
    }  # fmt: skip


def test_a_forward_overflow_predicted_stuck_and_a_fit_skips_every_step(rm, flown):
    model, batch, _, report = flown("logsumexp")
    f16 = next(c for c in report.candidates if c.policy == "mixed_float16")
    assert f16.predictions["stuck"] is True
    assert f16.predictions["first_nonfinite_layer"] == "logsumexp_pool"
    # truth: the layer's float16 output is not finite on the batch, its float32 output is
    mixed = _under("mixed_float16", rm, "logsumexp", model)
    tap = keras.Model(mixed.inputs[0], mixed.get_layer("logsumexp_pool").output)
    assert not np.isfinite(np.asarray(tap(batch[0]), np.float32)).all()
    ref = keras.Model(model.inputs[0], model.get_layer("logsumexp_pool").output)
    assert np.isfinite(np.asarray(ref(batch[0]))).all()
    # truth: a short fit under mixed_float16 skips every step and lowers the scale
    mixed.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    _fit(mixed, batch, steps=5)
    assert int(mixed.optimizer.iterations.numpy()) == 0
    assert float(mixed.optimizer.dynamic_scale.numpy()) == 2.0**10  # 2^15 halved 5 times


def test_the_recommendation_applied_trains_and_its_problem_is_gone(rm, flown):
    """The change grew as it was checked: keeping the float16 softmax 'output' in float32 made
    the check of 'logsumexp_pool' in float32 finite (the softmax's backward pass had overflowed
    it); both are the change, printed and applied alike, and the fit with it trains."""
    model, batch, _, report = flown("logsumexp")
    assert report.recommended == "mixed_float16"
    chosen = report.chosen
    assert chosen.verdict == "ready with the change"
    assert set(chosen.fix.float32_layers) == {"output", "logsumexp_pool"}
    assert chosen.checked is not None and chosen.checked.problems == []
    assert chosen.code_changes == []  # normalizing the inputs is not needed with the change
    # the code printed is the change applied
    code = recommendation_code(report)
    assert printed_layers(code) == list(chosen.fix.float32_layers)
    assert 'set_global_policy("mixed_float16")' in code
    fixed = mpwatch.apply_recommendations(model, report.findings)
    assert fixed.policy == "mixed_float16"
    assert set(fixed.layers) == set(chosen.fix.float32_layers)
    # truth: the fixed model's pool output is finite on the batch, its output float32
    tap = keras.Model(fixed.model.inputs[0], fixed.model.get_layer("logsumexp_pool").output)
    assert np.isfinite(np.asarray(tap(batch[0]), np.float32)).all()
    assert keras.backend.standardize_dtype(fixed.model(batch[0]).dtype) == "float32"
    loss = _fit(fixed.model, batch, steps=8)
    assert np.isfinite(loss)
    assert int(fixed.model.optimizer.iterations.numpy()) >= 1  # it trains (after the skips)


def _skipper(policy="float32"):
    """Dense(64, relu) -> Dense(10, softmax) on inputs of a few hundred: its scaled gradients
    overflow float16 at 2^15, its forward pass does not."""
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(policy)
    try:
        m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])  # fmt: skip
    finally:
        keras.mixed_precision.set_global_policy("float32")
    m.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    return m


def test_gradients_overflowing_at_keras_start_predict_the_skips_a_fit_makes(tmp_path):
    model = _skipper()
    rng = np.random.default_rng(0)
    batch = ((rng.normal(size=(32, 32)) * 300).astype("float32"), rng.integers(0, 10, (32,)))
    report = mpwatch.preflight(model, batch, policies=("mixed_float16",), log_dir=str(tmp_path))
    (c,) = report.candidates
    p = c.predictions
    assert p["skips"] is True and p["stuck"] is False
    fewest, most = p["skipped_steps"]
    assert fewest >= 1 and most <= 15
    # truth: the same network built under mixed_float16 skips that many steps, then trains
    mixed = _skipper("mixed_float16")
    mixed.set_weights(model.get_weights())
    steps = 16
    _fit(mixed, batch, steps=steps)
    skipped = steps - int(mixed.optimizer.iterations.numpy())
    assert fewest <= skipped <= most, (skipped, p)
    assert float(mixed.optimizer.dynamic_scale.numpy()) == 2.0 ** (15 - skipped)
    # the recommendation, applied: its problems gone (a float32 output), and it trains
    assert report.recommended == "mixed_float16" and c.verdict == "ready with the change"
    assert c.checked is not None and c.checked.problems == []
    fixed = mpwatch.apply_recommendations(model, report.findings)
    assert set(fixed.layers) == set(c.fix.float32_layers)
    assert fixed.layers == list(c.fix.float32_layers)
    assert keras.backend.standardize_dtype(fixed.model(batch[0]).dtype) == "float32"
    loss = _fit(fixed.model, batch, steps=steps)
    assert np.isfinite(loss) and int(fixed.model.optimizer.iterations.numpy()) >= steps - most


def test_predicted_underflow_is_the_train_steps_own(rm, flown):
    model, batch, _, report = flown("sigmoid_mlp")
    f16 = next(c for c in report.candidates if c.policy == "mixed_float16")
    scale = f16.predictions["scale"]
    assert scale == 2.0**15
    mixed = _under("mixed_float16", rm, "sigmoid_mlp", model)
    x, y = batch
    with rm.policy_scope("mixed_float16"):
        grads, _ = rm.train_mode_gradients(mixed, x, y, scale)
    ref, _ = rm.train_mode_gradients(model, x, y, 1.0)
    truth = rm.underflow_fraction(grads, ref)
    assert truth > 0.05
    assert f16.predictions["zero_fraction"] == pytest.approx(truth, abs=0.01)
    # underflow proper: the reference's nonzero elements below float16's smallest subnormal at
    # the scale (numpy on the reference), what float16 cannot hold whatever else happens
    nonzero = np.concatenate([np.abs(g[g != 0]).ravel() for g in ref]).astype(np.float64)
    below = float(np.mean(nonzero * scale < 2.0**-24))
    assert f16.predictions["underflow_fraction"] == pytest.approx(below, abs=0.01)
    assert f16.verdict != "ready"
    assert any(f.rule == "gradient-underflow" for f in f16.problems)


def test_every_format(flown):
    _, _, _, report = flown("logsumexp")
    data = json.loads(report.render("json"))
    assert data["recommended"] == "mixed_float16"
    assert data["fix"]["policy"] == "mixed_float16"
    assert set(data["fix"]["float32_layers"]) == {"output", "logsumexp_pool"}
    assert [c["policy"] for c in data["candidates"]] == ["mixed_float16", "mixed_bfloat16"]
    assert any("optimizer state" in line for line in data["candidates"][0]["memory"])
    # Adam's two moments counted before any step (a built copy of the unbuilt optimizer)
    own = mpwatch.load_run(report.candidates[0].run).memory_by_policy.iloc[0]
    weights = sum(int(np.prod(w.shape)) * 4 for w in flown("logsumexp")[0].trainable_weights)
    assert own["weights"] == weights and own["optimizer_state"] >= 2 * weights
    text = report.render("text")
    assert "Recommendation: mixed_float16" in text and "Unchecked" in text
    md = report.render("markdown")
    assert md.startswith("# mpwatch pre-flight") and "```python" in md
    page = report.render("html")
    assert page.startswith("<!doctype html>") and "mixed_float16" in page
    with pytest.raises(ValueError, match="one of"):
        report.render("pdf")
    # the candidates' runs are runs like a fit's: the CLI's diagnosis reads them
    findings = mpwatch.diagnose(report.log_dir)
    assert any(f.rule == "preflight-policy" for f in findings)


def test_bad_arguments_are_clear_errors():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    batch = (np.ones((4, 3), "float32"), np.ones((4, 2), "float32"))
    with pytest.raises(ValueError, match="not compiled"):
        mpwatch.preflight(m, batch)
    m.compile("adam", "mse")
    with pytest.raises(ValueError, match="policies must be"):
        mpwatch.preflight(m, batch, policies=("float16",))
    with pytest.raises(TypeError, match="keras.Model"):
        mpwatch.preflight("model.keras", batch)


def test_the_command_line(tmp_path):
    from mpwatch.__main__ import main

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(4)])  # fmt: skip
    m.compile("adam", "mse")
    m.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "b.npz", x=rng.normal(size=(16, 8)).astype("float32"),
             y=rng.normal(size=(16, 4)).astype("float32"))  # fmt: skip
    out = tmp_path / "r.json"
    args = ["preflight", str(tmp_path / "m.keras"), str(tmp_path / "b.npz")]
    code = main([*args, "--format", "json", "-o", str(out), "--log-dir", str(tmp_path / "runs")])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["recommended"] in ("mixed_float16", "mixed_bfloat16")
    assert (tmp_path / "runs" / "mixed_float16").is_dir()
    assert main([*args[:2], str(tmp_path / "missing.npz")]) == 2
    np.savez(tmp_path / "one.npz", a=np.ones(3))
    assert main([*args[:2], str(tmp_path / "one.npz")]) == 2
    assert main([*args, "--policies", "float16"]) == 2


def test_a_model_whose_forward_pass_fails_is_not_measured_and_nothing_raises(tmp_path):
    class Twice(keras.Model):  # its call works while it is built, then no more
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(2)
            self.broken = False

        def call(self, x):
            if self.broken:
                raise NotImplementedError("this model trains through its own train_step")
            return self.d(x)

    m = Twice()
    m(np.ones((1, 3), "float32"))
    m.broken = True
    m.compile("adam", "mse")
    batch = (np.ones((4, 3), "float32"), np.ones((4, 2), "float32"))
    report = mpwatch.preflight(m, batch, log_dir=str(tmp_path))
    assert report.recommended == "float32"
    assert [c.verdict for c in report.candidates] == ["not measured", "not measured"]
    assert "forward pass failed" in report.candidates[0].reason
    assert "NotImplementedError" in report.candidates[0].reason
    assert "no candidate is ready" in report.render("text")


def test_the_findings_apply_exactly_the_printed_change(tmp_path):
    """keras.io's timeseries classifier as a small stand-in: its 2-class float16 softmax, finite
    on the first batch (in a fit, a probe that measured no harm yet makes it info), keeps its
    severity in a pre-flight, where no step has run: the change keeps it float32, and exactly
    the layers printed in the recommendation are the ones apply_recommendations applies with
    report.findings."""
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(2, activation="softmax")])  # fmt: skip
    m.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(32, 8)).astype("float32"), rng.integers(0, 2, (32,)))
    report = mpwatch.preflight(m, batch, policies=("mixed_float16",), log_dir=str(tmp_path))
    (c,) = report.candidates
    out = [f for f in c.findings if f.rule == "output-16bit"]
    assert out and out[0].severity == "error" and out[0].layer == m.layers[-1].name
    assert "measured" not in out[0].evidence  # (no "no measurable harm yet" before any step)
    assert c.verdict == "ready with the change" and c.fix.float32_layers == (m.layers[-1].name,)
    printed = printed_layers(recommendation_code(report))
    fixed = mpwatch.apply_recommendations(m, report.findings)
    assert fixed.policy == "mixed_float16" and fixed.layers == printed == [m.layers[-1].name]


def test_tensorflow_retracing_warnings_about_mpwatch_functions_are_left_out(caplog):
    """The pre-flight traces a probe per candidate and per change: TensorFlow's warning that
    "calls to <function probe_function.<locals>.fn> triggered tf.function retracing" reads as a
    fault of the user's code. It is left out while the pre-flight runs; the same warning about
    the user's own function, and any other, still shows, and after it everything does."""
    from mpwatch.launch.check import own_retracing_quiet

    tf_logger = tf.get_logger()
    ours = ("5 out of the last 11 calls to <function probe_function.<locals>.fn at 0x7f> "
            "triggered tf.function retracing. Tracing is expensive")  # fmt: skip
    theirs = ours.replace("probe_function.<locals>.fn", "my_train_step")
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with own_retracing_quiet():
            tf_logger.warning(ours)
            tf_logger.warning(theirs)
            tf_logger.warning("another warning")
        tf_logger.warning(ours)
    said = [r.getMessage() for r in caplog.records if r.name == "tensorflow"]
    assert said == [theirs, "another warning", ours]
