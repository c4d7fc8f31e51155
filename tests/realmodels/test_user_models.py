"""Models of issue 50, one per class of problem, as their users write them
(``examples/user_models.py``): each trained with mpwatch's monitor beside an observer of the
optimizer's own state, diagnosed, then trained again with the fix. Every finding is checked
against truth computed here (the optimizer's raw step counter, numpy on the checkpoint's weights,
gradient tapes of the model and its float32 twin), and every fix must make its problem go away.
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
from printed_fix import every_fix_alike, printed_and_applied  # noqa: E402

import mpwatch  # noqa: E402
from mpwatch import contract  # noqa: E402
from mpwatch.judge.fixes.fix import Fix  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def um():
    return load_script("examples/user_models.py")


@pytest.fixture(scope="module")
def trained(um, tmp_path_factory):
    """(name, fixed) -> (model, observer, findings, logdir), each trained once."""
    cache = {}

    def get(name, fixed=False):
        key = (name, fixed)
        if key not in cache:
            logdir = str(tmp_path_factory.mktemp(f"{name}{'_fixed' if fixed else ''}"))
            keras.backend.clear_session()  # names as in a fresh process: a fresh build's
            model, _, observer = um.train(name, logdir, fixed=fixed)
            cache[key] = (model, observer, mpwatch.diagnose(logdir), logdir)
        return cache[key]

    return get


def _of(findings, rule):
    return [f for f in findings if f.rule == rule]


def skipped(raw):
    """The 1-based batches the optimizer did not take: its raw step counter did not advance."""
    before = [0, *raw]
    return [i + 1 for i in range(len(raw)) if before[i + 1] == before[i]]


def recorded_skips(logdir):
    return [int(s) for s in mpwatch.load_run(logdir).skipped_steps().index]


def gradients(model, x, y, scale):
    """The model's weight gradients of its loss times ``scale`` on one batch (a tape)."""
    with tf.GradientTape() as tape:
        pred = model(x, training=True)
        loss = tf.cast(model.compute_loss(x=x, y=y, y_pred=pred), tf.float32) * scale
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def all_finite(grads):
    return all(np.isfinite(g).all() for g in grads)


# --- gradient accumulation: one step accounting ------------------------------------------------
def test_accumulation_skips_are_the_optimizers_own(um, trained):
    model, observer, findings, logdir = trained("accumulation")
    truth = skipped(observer.raw)  # the inner optimizer's raw counter, read after each batch
    assert truth == [b + 1 for b in um.BAD_BATCHES]
    assert recorded_skips(logdir) == truth
    # under accumulation Keras' public iterations advance once per 4 batches: never a skip
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) < len(observer.raw) / 2
    (bad,) = _of(findings, "bad-batches")
    x, _ = um.accumulation_data()
    peaks = [float(np.abs(x[b * 16 : (b + 1) * 16]).max()) for b in um.BAD_BATCHES]
    assert all(p > 65504 for p in peaks)  # truth: those batches hold values float16 cannot
    assert bad.severity == "error"
    assert f"steps {', '.join(map(str, truth[:-1]))}, {truth[-1]}" in bad.title
    # no descent that never happened, no failed doubling, no scale advice
    assert _of(findings, "loss-scale") == [] and _of(findings, "skipped-steps") == []
    assert not any(Fix.of(f).loss_scale for f in findings)
    _, fixed_observer, fixed_findings, fixed_logdir = trained("accumulation", fixed=True)
    assert skipped(fixed_observer.raw) == [] == recorded_skips(fixed_logdir)
    assert _of(fixed_findings, "bad-batches") == []


# --- a float32 checkpoint fine-tuned: an overflow chain, printed and applied alike --------------
def _builder(um, name):
    """build(policy) -> a fresh compiled model of ``name`` (for printed_fix)."""
    return lambda policy: um.build(name, policy=policy or um.POLICY)[0]


def _printed_float32(code):
    """The layers a printed fix keeps float32, read here with the test's own pattern."""
    code = "\n".join(line.split("#", 1)[0] for line in code.splitlines())
    return sorted(set(re.findall(r'dtype="float32",\s*name="([^"]+)"', code)))


def test_finetune_overflow_chain_printed_and_applied_alike(um, trained):
    _, observer, findings, logdir = trained("finetune")
    assert len(skipped(observer.raw)) == len(observer.raw)  # every step skipped: NaN fit
    # truth: the checkpoint's float32 activations on the training data (numpy)
    x, y = um.finetune_data()
    w = um.finetune_checkpoint()
    acts, h = {}, x.astype(np.float64)
    for i, name in enumerate(("d1", "d2", "d3")):
        h = np.maximum(h @ w[2 * i] + w[2 * i + 1], 0)
        acts[name] = float(np.abs(h).max())
    assert acts["d1"] < 65504 / 8 and acts["d2"] > 65504 / 8 and acts["d3"] > 65504
    (f,) = [f for f in findings if f.severity == "error"]
    assert f.rule == "activation-overflow" and f.layer == "d3"
    assert sorted(Fix.of(f).float32_layers) == ["d2", "d3"] == _printed_float32(f.fix)
    assert "keeping 'd3', 'd2' float32: finite, in range" in f.evidence
    assert not [g for g in findings if g is not f and g.layer in ("d2", "d3")]  # one finding
    # the printed code done on a fresh model, and applied: the same layer policies
    printed, applied = printed_and_applied([f], _builder(um, "finetune"))
    assert {ly.name: ly.compute_dtype for ly in printed.layers if ly.name[0] in "dh"} == {
        "d1": "float16", "d2": "float32", "d3": "float32", "head": "float32"}  # fmt: skip
    # both retrain with the problem gone
    for model, label in ((applied, "_applied"), (printed, "_printed")):
        logdir2 = str(logdir) + label
        trained_model, history, obs = um.train("finetune", logdir2, model=model, fixed=True)
        assert skipped(obs.raw) == [] and np.isfinite(history.history["loss"]).all()
        assert not [g for g in mpwatch.diagnose(logdir2) if g.severity == "error"]


# --- an LSTM on a raw target: the cause named --------------------------------------------------
def test_lstm_raw_target_named_as_the_cause(um, trained):
    model, observer, findings, logdir = trained("lstm_raw")
    truth = skipped(observer.raw)
    assert recorded_skips(logdir) == truth and len(truth) >= 10
    assert min(s for s in observer.scale if s is not None) <= 1.0  # the scale fell below 1
    (f,) = _of(findings, "target-range")
    assert f.severity == "error"
    # truth: the target (numpy) and what standardising it does to the backward pass (tapes on
    # the initial weights, at the scale of the probe that checked it)
    x, y = um.lstm_raw_data()
    target = f.data["target"]
    batch = slice(0, um.BATCH["lstm_raw"])
    assert target["mean"] == pytest.approx(float(y[batch].mean()), rel=0.05)
    assert target["max_abs"] > 900
    fresh, _, _ = um.build("lstm_raw")
    step_scale = next(
        rec["loss_scale"] for step, rec in mpwatch.load_run(logdir).records[contract.KIND_PROBE]
        if step == f.data["step"]
    )  # fmt: skip
    yb = y[batch]
    z = (yb - yb.mean()) / yb.std()
    assert not all_finite(gradients(fresh, x[batch], yb, step_scale))
    assert all_finite(gradients(fresh, x[batch], z, step_scale))
    # its consequences are its evidence, not findings of their own
    assert {"skipped-steps", "loss-scale"} <= set(f.data.get("also", []))
    assert _of(findings, "skipped-steps") == _of(findings, "loss-scale") == []
    # the fix, applied: the scale stays high, the descent is Keras' usual few halvings
    _, fixed_obs, fixed_findings, _ = trained("lstm_raw", fixed=True)
    assert _of(fixed_findings, "target-range") == []
    assert len(skipped(fixed_obs.raw)) <= 5 and min(fixed_obs.scale) >= 2.0**10


# --- keras.io's Distiller: a subclassed model holding two models ------------------------------
def _heads(distiller):
    return {distiller.student.layers[-1].name: "student",
            distiller.teacher.layers[-1].name: "teacher"}  # fmt: skip


def _loss(model, x, y):
    pred = model(x, training=False)
    return float(keras.ops.convert_to_numpy(model.compute_loss(x=x, y=y, y_pred=pred)))


def test_distiller_float16_logits_named_measured_and_fixed_in_place(um, trained):
    # Keras numbers layer names per session: each build here starts a session, so the fresh
    # model the printed code runs on has the names the diagnosis printed
    keras.backend.clear_session()
    model, _, findings, _ = trained("distiller")
    heads = _heads(model)
    outs = {f.layer: f for f in _of(findings, "output-16bit")}
    assert set(outs) == set(heads)
    for name, owner in heads.items():
        layer = next(ly for ly in model._flatten_layers() if ly.name == name)
        assert layer.compute_dtype == "float16"  # truth: the layer computes in float16
        assert f"output of sub-model {owner!r}" in outs[name].evidence
    # the effect, measured here: the trained weights' loss on the first batches in float16,
    # float32, and with both heads in float32 (the fix)
    x, y = um.distiller_data()
    ref, _, _ = um.build("distiller", policy="float32")
    ref.set_weights(model.get_weights())
    fixed, _, _ = um.build("distiller", fixed=True)
    fixed.set_weights(model.get_weights())
    errs, fixed_errs = [], []
    for b in range(3):
        xb, yb = x[b * 32 : (b + 1) * 32], y[b * 32 : (b + 1) * 32]
        l32 = _loss(ref, xb, yb)
        errs.append(abs(_loss(model, xb, yb) - l32) / l32)
        fixed_errs.append(abs(_loss(fixed, xb, yb) - l32) / l32)
    assert max(errs) > 0.001 and max(fixed_errs) < 0.001  # harm measured, the fix removes it
    assert {f.severity for f in outs.values()} == {"error"}
    # the Distiller is subclassed: apply_recommendations cannot clone it, and no fix says it
    with pytest.raises(ValueError, match="subclassed"):
        mpwatch.apply_recommendations(um.build("distiller")[0], findings)
    for f in outs.values():
        assert "apply_recommendations(model" not in f.fix
    # the printed in-place code, run on a fresh Distiller, gives the fix's layer policies
    keras.backend.clear_session()
    fresh, _, _ = um.build("distiller")
    code = "\n".join(f.fix.split("\n", 1)[1] for f in outs.values())
    exec(code, {"model": fresh})  # noqa: S102 - the diagnosis' own printed fix
    assert {ly.name: ly.compute_dtype for ly in fresh._flatten_layers() if ly.name in heads} == {
        name: "float32" for name in heads
    }
    # the task's 10-class heads are never asked to be padded
    assert not {f.layer for f in _of(findings, "tensor-core-alignment")} & set(heads)
    # retrained with the printed fix: the 16-bit outputs are gone and the probe's loss is
    # float32's
    logdir2 = str(trained("distiller")[3]) + "_in_place"
    um.train("distiller", logdir2, model=fresh)
    assert _of(mpwatch.diagnose(logdir2), "output-16bit") == []
    pm = mpwatch.load_run(logdir2).probe_model
    assert ((pm["loss"] - pm["ref_loss"]).abs() / pm["ref_loss"]).max() < 0.001


# --- keras.io's Siamese network: a float16 distance ----------------------------------------------
def test_siamese_skip_is_the_float16_pass_where_float32_fits(um, trained):
    model, observer, findings, logdir = trained("siamese")
    truth = skipped(observer.raw)
    assert truth == recorded_skips(logdir) == [2]
    (f,) = _of(findings, "skipped-steps")
    assert "the float16 pass overflowed where its float32 twin would not" in f.evidence
    # its output computes in float32 already (truth: the model's own head): no advice to keep
    # it float32, which would change nothing
    assert model.get_layer("head").compute_dtype == "float32"
    assert "Keep the model's output float32" not in f.fix
    assert "outputs compute\n# in float32 already" in f.fix
    # truth: the model after its first batch (the same step, replayed), on the batch that
    # skipped: float16's gradients at 2^15 not finite, the float32 twin's times 2^15 in range
    replay, x, y = um.build("siamese")
    b = um.BATCH["siamese"]
    replay.train_on_batch([x[0][:b], x[1][:b]], y[:b])
    twin, _, _ = um.build("siamese", policy="float32")
    twin.set_weights(replay.get_weights())
    xb, yb = [x[0][b : 2 * b], x[1][b : 2 * b]], y[b : 2 * b]
    assert not all_finite(gradients(replay, xb, yb, 2.0**15))
    ref = gradients(twin, xb, yb, 1.0)
    assert max(float(np.abs(g).max()) for g in ref) * 2.0**15 < 65504
    # the distance in float32 (the fix): no step skipped
    _, fixed_obs, fixed_findings, _ = trained("siamese", fixed=True)
    assert skipped(fixed_obs.raw) == [] and _of(fixed_findings, "skipped-steps") == []


# --- a user-written RMSNorm: the overflow named at its op --------------------------------------
def test_rmsnorm_square_overflow_named_at_the_op_and_fixed(um, trained):
    model, observer, findings, logdir = trained("rmsnorm")
    norms = ["norm0", "norm1", "norm_out"]
    errors = {f.layer: f for f in findings if f.severity == "error"}
    assert set(errors) == set(norms)
    x, y = um.rmsnorm_data()
    for name in norms:
        f = errors[name]
        assert f.rule == "output-rel-error" and "Square overflows float16" in f.title
        assert "(user_models.py:" in f.evidence  # the user's own line: ops.square(x)
        # truth (numpy): the norm's float16 input on the first batch, squared in float16, is
        # inf in some row; its mean is inf, rsqrt(inf) 0: the output rows are all 0
        layer = model.get_layer(name)
        xin = np.asarray(keras.Model(model.inputs, layer.input)(x[:64]))
        assert xin.dtype == np.float16
        with np.errstate(over="ignore"):
            sq = np.square(xin)
        assert np.isinf(sq).any() and np.isfinite(xin).all()
        out = np.asarray(layer(xin))
        rows = np.isinf(sq).any(axis=1)
        assert np.isfinite(out).all() and (out[rows] == 0).all()
        assert f.data["op_overflow"]["input_max_abs"] == pytest.approx(
            float(np.abs(xin).max()), rel=0.5
        )  # the probe's batch, a later step's weights
    # the model trains at chance, and the mechanisms that follow are its evidence
    assert _of(findings, "gradient-underflow") == _of(findings, "loss-scale") == []
    # printed and applied alike: the three norms in float32
    fix = [Fix.of(f).float32_layers for f in errors.values()]
    assert sorted(n for names in fix for n in names) == norms
    printed, applied = printed_and_applied(list(errors.values()), _builder(um, "rmsnorm"))

    def norm_dtypes(m):
        return sorted(ly.compute_dtype for ly in m.layers if type(ly).__name__ == "RMSNorm")

    assert norm_dtypes(applied) == norm_dtypes(printed) == ["float32"] * 3
    # both retrain with the problem gone: no skip, no error, the loss below chance
    for m, label in ((applied, "_applied"), (printed, "_printed")):
        logdir2 = str(logdir) + label
        _, history, obs = um.train("rmsnorm", logdir2, model=m, fixed=True)
        assert skipped(obs.raw) == []
        assert history.history["loss"][-1] < 0.68  # chance is log(2) = 0.693
        assert not [g for g in mpwatch.diagnose(logdir2) if g.severity == "error"]


# --- every fix: printed and applied alike, both retrained with the problem gone ----------------
#: fixes retrained printed and applied in their model's own test
OWN_RETRAIN = {("finetune", "activation-overflow"), ("rmsnorm", "output-rel-error")}


@pytest.mark.parametrize("name", ["accumulation", "finetune", "siamese", "lstm_raw", "distiller",
                                  "rmsnorm"])  # fmt: skip
def test_every_fix_printed_and_applied_alike(um, trained, name):
    """Each model-changing finding: its printed code done on a fresh model (printed_fix, which
    reads only the text) and apply_recommendations give the same layer policies and optimizer;
    both retrain on the model's own data without the finding."""
    _, _, findings, logdir = trained(name)

    def retrain(model, f, label):
        um.train(name, f"{logdir}_{label}", model=model)
        return f"{logdir}_{label}"

    def retrained(f):  # the device's float32 is one fix for all six: retrained on one; the
        if (name, f.rule) in OWN_RETRAIN:  # fine-tune's and the RMSNorm's layer fixes: in
            return False  # their own tests, printed and applied, with more measures of harm
        return f.rule != "no-tensor-cores" or name == "siamese"

    checked = every_fix_alike(findings, _builder(um, name), retrain, retrained)
    assert [c for c in checked if c["left"]] == []


# --- the pre-flight (issue 53) of each model, against its fit's first steps ---------------------
@pytest.mark.parametrize("name", ["accumulation", "finetune", "siamese", "lstm_raw", "rmsnorm"])
def test_preflight_predicts_the_fits_first_skips(um, trained, tmp_path, name):
    """The pre-flight of each model as its fit built it (same seed: the fit's first weights), on
    the fit's first batch, under the fit's policy: the first step skipped as the optimizer's raw
    step counter says (Observer), a stuck scale where every step of the fit was skipped, the
    skips before the first step taken within the predicted range; the change it recommends
    applied and trained on the fit's first batches (preflown.check_the_change)."""
    _, observer, findings, _ = trained(name)
    fresh, x, y = um.build(name)
    bs = um.BATCH[name]
    batch = keras.tree.map_structure(lambda a: a[:bs], (x, y))
    report = mpwatch.preflight(fresh, batch, policies=(um.POLICY,), log_dir=str(tmp_path))
    (c,) = report.candidates
    p = c.predictions
    skips = skipped(observer.raw)
    assert c.verdict != "not measured", c.reason
    assert p["skips"] == (1 in skips), (p, observer.raw[:8])
    if p["stuck"]:
        assert skips == list(range(1, len(observer.raw) + 1))
    first = next((i for i, s in enumerate(skips) if s != i + 1), len(skips))
    if p.get("skipped_steps") and not p["stuck"]:
        fewest, most = p["skipped_steps"]
        assert fewest <= first <= most, (p, observer.raw[:20])
    if c.checked is not None and c.changes_model:  # the change applied, and a short fit with it
        check_the_change(c, fit_with_the_change(fresh, report, x, y, bs, steps_for(c)))
    check_same_causes(c, findings)


def test_preflight_refuses_a_model_it_cannot_see_in_one_line(um):
    """keras.io's Distiller is built by its first train step (a teacher and a student inside):
    the pre-flight says what to do instead of failing inside."""
    model, x, y = um.build("distiller")
    with pytest.raises(ValueError, match="not built|no forward pass"):
        mpwatch.preflight(model, (x[:8], y[:8]))
