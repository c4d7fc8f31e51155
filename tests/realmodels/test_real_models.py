"""mpwatch on models nobody here wrote (issue 17's acceptance): each trained for a few steps on
synthetic data by ``examples/real_models.py``, then its diagnosis checked against numbers computed
in the test itself: the train step's own gradients (training mode, plain TensorFlow) against a
float32 reference with the same weights, token ids cast with numpy.

- MobileNetV2: no underflow warning where the train step loses next to nothing;
- ResNet50: the float16 ``predictions`` softmax named, with a fix that works for
  ``keras.applications`` (built and checked here);
- keras.io's Transformer with its float32 ``Input``: the id rounding named, with numpy's count;
- a deep sigmoid MLP: underflow found, and the proposed change predicted and verified here to lose
  less;
- ``mixed_bfloat16``: no float16 measure anywhere;
- an overflowing custom layer: exactly one error, at that layer.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from repo_scripts import load_script

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from preflown import (  # noqa: E402
    check_same_causes,
    check_the_change,
    fit_with_the_change,
    steps_for,
)
from printed_fix import every_fix_alike  # noqa: E402

import mpwatch  # noqa: E402

STEPS = 20  # probes at steps 10 and 20 (probe_every=10)


@pytest.fixture(scope="module")
def rm():
    return load_script("examples/real_models.py")


@pytest.fixture(scope="module")
def trained(rm, tmp_path_factory):
    """scenario -> (model, logdir, findings, first batch): each trained once, on demand."""
    cache = {}

    def get(name):
        if name not in cache:
            logdir = str(tmp_path_factory.mktemp(name))
            keras.backend.clear_session()  # names as in a fresh process: a fresh build's
            model = rm.train(name, logdir, steps=STEPS, profile=False)
            x, y = rm.scenario_data(name)
            bs = rm.BATCH_SIZES[name]
            cache[name] = (model, logdir, mpwatch.diagnose(logdir), (x[:bs], y[:bs]))
        return cache[name]

    return get


def _text(f) -> str:
    return " ".join([f.title, f.evidence, f.fix])


def _truth(rm, name, model, batch, scale=None):
    """(underflow fraction, loss) of the train step's gradients against the float32 reference on
    the first training batch (the probe's batch), with the model's current weights."""
    x, y = batch
    policy = rm.POLICIES[name]
    with rm.policy_scope(policy):
        mixed, loss = rm.train_mode_gradients(model, x, y, scale)
    ref, ref_loss = rm.float32_reference_gradients(model, x, y, scenario=name)
    return rm.underflow_fraction(mixed, ref), loss, mixed, ref


def test_mobilenet_v2_no_underflow_warning_where_the_train_step_loses_nothing(rm, trained):
    model, logdir, findings, batch = trained("mobilenet_v2")
    truth, loss, _, _ = _truth(rm, "mobilenet_v2", model, batch)
    assert truth < 0.001  # the train step itself loses next to nothing
    run = mpwatch.load_run(logdir)
    probe = run.latest_probe()
    assert probe is not None and probe.model["reliable"] is True
    # the probe measured the train step's network: same loss, same (negligible) underflow
    assert probe.model["loss"] == pytest.approx(loss, rel=0.05)
    assert probe.model["underflow_fraction"] == pytest.approx(truth, abs=0.001)
    under = [f for f in findings if f.rule == "gradient-underflow" and f.at_least("warning")]
    assert under == [], [_text(f) for f in under]
    # 52 BatchNormalization layers: one line, not 52
    bn = [f for f in findings if f.rule == "float32-inside"]
    assert len(bn) <= 1


def test_resnet50_names_the_float16_softmax_with_a_fix_for_keras_applications(rm, trained):
    model, logdir, findings, _ = trained("resnet50")
    assert model.get_layer("predictions").compute_dtype == "float16"
    named = [f for f in findings if f.layer == "predictions" and f.at_least("warning")]
    assert named, [(f.rule, f.layer, f.title) for f in findings]
    fix = named[0].fix
    assert "classifier_activation=None" in fix
    assert re.search(r"Activation\(\s*\"softmax\".*dtype=\"float32\"", fix), fix
    # the fix works: built here as written, the output is a float32 softmax of the same logits
    with rm.policy_scope("mixed_float16"):
        base = keras.applications.ResNet50(
            input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None
        )
        out = keras.layers.Activation("softmax", dtype="float32")(base.output)
        fixed = keras.Model(base.input, out)
    fixed.set_weights(model.get_weights())
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    y = np.asarray(fixed(x))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    assert "keras.layers.ResNet50" not in fix and "keras.layers.predictions" not in fix


def test_transformer_float32_input_names_the_id_rounding(rm, trained):
    model, logdir, findings, batch = trained("transformer")
    x, _ = batch
    changed = int(np.count_nonzero(x.astype(np.float16).astype(np.float32) != x))
    assert changed > 0
    errors = [f for f in findings if f.rule == "id-rounding"]
    assert len(errors) == 1, [_text(f) for f in findings]
    (f,) = errors
    assert f.severity == "error"
    assert f.layer == "token_and_position_embedding"
    assert f.data["changed"] == changed
    assert 'dtype="int32"' in f.fix
    # a model whose custom layers take no **kwargs still got its float32 reference
    run = mpwatch.load_run(logdir)
    assert run.latest_probe().model["reference"] == "float32_twin"


def test_sigmoid_mlp_underflow_found_and_the_proposed_change_loses_less(rm, trained):
    model, logdir, findings, batch = trained("sigmoid_mlp")
    scale_used = rm.loss_scale(model)
    truth, _, _, _ = _truth(rm, "sigmoid_mlp", model, batch)
    assert truth > 0.05  # it really underflows
    under = [f for f in findings if f.rule == "gradient-underflow" and f.at_least("warning")]
    assert under, [_text(f) for f in findings]
    proposals = [f for f in findings if f.action.get("loss_scale") or f.action.get("initial_scale")]
    assert proposals, [(f.rule, f.action) for f in findings]
    f = proposals[0]
    proposed = float(f.action.get("loss_scale") or f.action.get("initial_scale"))
    assert proposed > scale_used  # never lower the scale to fight underflow
    predicted = f.data.get("predicted_underflow")
    assert predicted is not None and predicted < truth
    # verified here: the train step's gradients at the proposed scale lose less, as predicted
    at_proposed, _, mixed, _ = _truth(rm, "sigmoid_mlp", model, batch, scale=proposed)
    assert all(np.isfinite(g).all() for g in mixed)  # and nothing overflows
    assert at_proposed < truth
    assert at_proposed == pytest.approx(predicted, abs=0.05)


def test_bfloat16_run_has_no_float16_measure(rm, trained):
    _, logdir, findings, _ = trained("bfloat16")
    float16 = re.compile(r"(?<![bB])float16|subnormal|65504|loss scale", re.IGNORECASE)
    said = [_text(f) for f in findings if float16.search(_text(f).replace("mixed_bfloat16", ""))]
    assert said == []
    run = mpwatch.load_run(logdir)
    assert run.latest_probe(modes=("bfloat16",)) is not None


def test_overflowing_custom_layer_is_exactly_one_error_at_that_layer(rm, trained):
    model, logdir, findings, batch = trained("logsumexp")
    # ground truth: the layer's float16 output is non-finite, its float32 output is not
    x, _ = batch
    tap = keras.Model(model.inputs[0], model.get_layer("logsumexp_pool").output)
    assert not np.isfinite(np.asarray(tap(x), np.float32)).all()
    errors = [f for f in findings if f.severity == "error"]
    assert len(errors) == 1, [(f.rule, f.layer, f.title) for f in errors]
    (e,) = errors
    assert e.layer == "logsumexp_pool"
    assert "LogSumExpPool(" in e.fix and "keras.layers.LogSumExpPool" not in e.fix


# --- every fix: printed and applied alike, both retrained with the problem gone ----------------
#: findings of the model's structure (a layer's dtype, the device): a short fit shows them gone
STRUCTURAL = {"output-16bit", "no-tensor-cores"}


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet50", "transformer", "bfloat16",
                                  "logsumexp", "sigmoid_mlp"])  # fmt: skip
def test_every_fix_printed_and_applied_alike(rm, trained, name):
    """Each model-changing finding: its printed code done on a fresh model (printed_fix, which
    reads only the text; keras.applications' classifier set in place on the model the builder
    makes) and apply_recommendations give the same layer policies and optimizer; both retrain
    without the finding: as long as the run for a finding of the numbers, 1 step without a probe
    for one of the model's structure (it shows in the layers' record)."""
    _, logdir, findings, _ = trained(name)

    def retrain(model, f, label):
        short = {"steps": 1, "probe": False, "log_every": 1} if f.rule in STRUCTURAL else {}
        kwargs = {"steps": STEPS, "profile": False} | short
        rm.train(name, f"{logdir}_{label}", model=model, **kwargs)
        return f"{logdir}_{label}"

    build = lambda policy: rm.build(name, policy=policy)[0]  # noqa: E731
    def retrained(f):  # ResNet50's fixes are MobileNetV2's (a ResNet50 fit: minutes); the
        if name == "resnet50":  # device's float32 is one fix for all: retrained on one
            return False
        return f.rule != "no-tensor-cores" or name == "bfloat16"

    assert [c for c in every_fix_alike(findings, build, retrain, retrained) if c["left"]] == []


# --- the pre-flight (issue 53) against what the fit then did ------------------------------------
#: ResNet50 passes too (40 s of pre-flight and its float16 gradients on 2 cores: left to a run by
#: hand, ``pytest -k "preflight and resnet50"`` with it added here); MobileNetV2 is its kind
PREFLOWN = ["mobilenet_v2", "transformer", "bfloat16", "logsumexp", "sigmoid_mlp"]


@pytest.mark.parametrize("name", PREFLOWN)
def test_preflight_predicts_what_the_fit_did(rm, trained, tmp_path, name):
    """The pre-flight of each model as its fit built it (its policy, the same seed: the fit's
    first weights), on the fit's first batch, against that fit (``trained``: 20 steps): the
    first step skipped or not as plain TensorFlow's gradients at 2^15 say, a stuck scale where a
    forward pass overflows (no step applied), the skips within the predicted range; and the
    change it recommends checked (recorded again, its problems gone), then applied and trained
    on the fit's first batches: what it was predicted to leave (preflown.check_the_change)."""
    model, _, findings, batch = trained(name)
    policy = rm.POLICIES[name]
    fresh, _, _ = rm.build(name)
    report = mpwatch.preflight(fresh, batch, policies=(policy,), log_dir=str(tmp_path))
    (c,) = report.candidates
    p = c.predictions
    skipped = STEPS - int(model.optimizer.iterations.numpy())
    if policy == "mixed_float16":
        with rm.policy_scope(policy):
            grads, _ = rm.train_mode_gradients(fresh, *batch, 2.0**15)
        # (rm's gradients run Dropout off, as the probe's own pass does; the train step's own
        # pass, Dropout on, is the pre-flight's other measure)
        assert p["probe_pass_finite"] == all(np.isfinite(g).all() for g in grads), p
        assert p["skips"] == (not p["probe_pass_finite"] or p["train_step_pass_finite"] is False)
        if p["stuck"]:
            assert skipped == STEPS
        elif p["skips"]:
            fewest, most = p["skipped_steps"]
            assert fewest <= skipped <= most, (p, skipped)
    else:
        assert p["skips"] is False and p["stuck"] is False and skipped == 0
    if c.verdict == "ready with the change":
        assert c.checked is not None or c.code_changes
        if c.checked is not None:
            assert [f.rule for f in c.checked.problems if f.rule not in
                    {f.rule for f in c.code_changes}] == []  # fmt: skip
    if c.checked is not None and c.changes_model:  # the change applied, and a short fit with it
        x, y = rm.scenario_data(name)
        bs = rm.BATCH_SIZES[name]
        check_the_change(c, fit_with_the_change(fresh, report, x, y, bs, steps_for(c)))
    check_same_causes(c, findings)
    assert report.recommended in (policy, "float32")
