"""Models whose problem has one cause (issue 24): four that break mixed precision's contract in
their own train step, bad batches, unnormalized inputs; each trained with mpwatch's monitor by
``examples/cause_models.py``, then trained again with the finding's fix applied. Every finding
is checked against truth computed here (the train step's own gradients against a float32 twin's,
the optimizers' own classes and iterations, the weights' dtypes, the batches' values), and every
fix must make its problem go away when applied.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from repo_scripts import load_script

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from printed_fix import every_fix_alike  # noqa: E402

import mpwatch  # noqa: E402
from mpwatch.judge.evidence.skip_causes import skip_causes  # noqa: E402
from mpwatch.show.summary import run_summary  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cm():
    return load_script("examples/cause_models.py")


@pytest.fixture(scope="module")
def trained(cm, tmp_path_factory):
    """(name, fixed) -> (model, history, findings): each trained once, on demand."""
    cache = {}

    def get(name, fixed=False):
        key = (name, fixed)
        if key not in cache:
            logdir = str(tmp_path_factory.mktemp(f"{name}{'_fixed' if fixed else ''}"))
            keras.backend.clear_session()  # names as in a fresh process: a fresh build's
            model, history = cm.train(name, logdir, fixed=fixed)
            cache[key] = (model, history, mpwatch.diagnose(logdir), logdir)
        return cache[key]

    return get


def _of(findings, rule):
    return [f for f in findings if f.rule == rule]


def _errors(findings):
    return [(f.rule, f.title) for f in findings if f.severity == "error"]


def test_custom_train_step_without_scale_loss(cm, trained):
    model, history, findings, _ = trained("custom_step")
    (f,) = _of(findings, "train-step")
    assert f.severity == "error" and f.data["cause"] == "loss_not_scaled"
    assert "self.optimizer.scale_loss(loss)" in f.fix
    # truth: what this train step hands the optimizer against the float32 reference, by hand
    x, y = cm.custom_step_data()
    x, y = x[:32], y[:32]
    with cm.policy_scope("mixed_float16"):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(y=y, y_pred=model(x, training=True))
        mixed = tape.gradient(loss, model.trainable_variables)
    with cm.policy_scope("float32"):
        ref_model = cm.custom_step_model()
    ref_model.set_weights(model.get_weights())
    with tf.GradientTape() as tape:
        ref_loss = ref_model.compute_loss(y=y, y_pred=ref_model(x, training=True))
    ref = tape.gradient(ref_loss, ref_model.trainable_variables)
    ratio = np.median([math.log2(np.abs(m).max() / np.abs(r).max()) for m, r in zip(mixed, ref)])
    scale = float(model.optimizer.dynamic_scale.numpy())
    assert math.log2(scale) >= 10  # the scale the optimizer divides by
    assert abs(ratio) < 1.0  # the train step hands it unscaled gradients
    assert f.data["loss_scale"] == scale
    assert abs(f.data["log2_ratio"] - ratio) < 2.0  # mpwatch measured the same, on its batches
    # the user sees it too: training stalls
    losses = history.history["loss"]
    assert losses[-1] > 0.9 * losses[0]
    # the fix, applied: the finding is gone and the model trains
    _, fixed_history, fixed_findings, _ = trained("custom_step", fixed=True)
    assert _of(fixed_findings, "train-step") == []
    assert fixed_history.history["loss"][-1] < losses[-1] / 10
    assert _errors(fixed_findings) == []


def test_gan_with_two_unscaled_optimizers(trained):
    gan, _, findings, logdir = trained("gan")
    (f,) = _of(findings, "train-step")
    # truth from the optimizers themselves
    lso = keras.optimizers.LossScaleOptimizer
    assert not isinstance(gan.d_optimizer, lso) and not isinstance(gan.g_optimizer, lso)
    assert int(gan.d_optimizer.iterations.numpy()) > 0
    assert int(gan.g_optimizer.iterations.numpy()) > 0
    assert isinstance(gan.optimizer, lso) and int(gan.optimizer.iterations.numpy()) == 0
    assert f.severity == "error" and sorted(f.data["optimizers"]) == ["d_optimizer", "g_optimizer"]
    assert f.data["idle_compiled"] is True and "never stepped" in f.evidence
    assert "LossScaleOptimizer(self.d_optimizer)" in f.fix and "scale_loss" in f.fix
    # no probe of a model without call(), said as what it is (info), never an error
    assert not [e for e in _errors(findings) if e[0] == "recording"]
    # no loss-scale finding about the compiled optimizer that never stepped
    assert _of(findings, "loss-scale") == [] and _of(findings, "skipped-steps") == []
    # each sub-model's float16 output (the critic's score, the image), named with its sub-model,
    # as info: which one reaches a loss in float16 is the train step's business
    heads = {gan.discriminator.layers[-1].name: "discriminator",
             gan.generator.layers[-1].name: "generator"}  # fmt: skip
    outs = {f.layer: f for f in _of(findings, "output-16bit")}
    assert set(outs) == set(heads) and {f.severity for f in outs.values()} == {"info"}
    for layer, owner in heads.items():
        assert f"output of sub-model {owner!r}" in outs[layer].evidence
    # their widths (a 1-unit score, a 1-channel image) are the task's: no padding asked
    assert not {f.layer for f in _of(findings, "tensor-core-alignment")} & set(heads)
    # the run's headline: not the idle compiled optimizer's scale, but that neither scales
    run = mpwatch.load_run(logdir)
    summary = run_summary(run)
    assert summary["final_loss_scale"] is None
    assert summary["loss_scales"] == {"d_optimizer": None, "g_optimizer": None}
    # the fix, applied: each optimizer loss-scaled and stepping, no error left
    fixed, _, fixed_findings, fixed_logdir = trained("gan", fixed=True)
    assert isinstance(fixed.d_optimizer, lso) and isinstance(fixed.g_optimizer, lso)
    assert int(fixed.d_optimizer.iterations.numpy()) > 0
    assert _of(fixed_findings, "train-step") == []
    assert _errors(fixed_findings) == []
    # its headline: each stepping optimizer's own final scale (truth: their variables)
    summary = run_summary(mpwatch.load_run(fixed_logdir))
    assert summary["final_loss_scale"] is None
    assert summary["loss_scales"] == {
        "d_optimizer": float(fixed.d_optimizer.dynamic_scale.numpy()),
        "g_optimizer": float(fixed.g_optimizer.dynamic_scale.numpy()),
    }


def test_a_gans_own_optimizers_that_skip_every_step_are_an_error(cm, tmp_path):
    """The GAN fixed as the diagnosis says (its own LossScaleOptimizers), with a discriminator
    whose features overflow float16 (a Dense of weights 3000 on 64 pixels): every update of both
    optimizers is skipped, so neither advances its iterations, and only their scales tell."""
    keras.utils.set_random_seed(0)
    with cm.policy_scope("mixed_float16"):
        gan = cm.gan_model(fixed=True)
        gan.discriminator = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(32, kernel_initializer=keras.initializers.Constant(3000.0)),
            keras.layers.Dense(1),
        ], name="discriminator")  # fmt: skip
        monitor = mpwatch.MixedPrecisionMonitor(str(tmp_path), log_every=5, profile=False)
        gan.fit(cm.gan_data()[0], batch_size=32, epochs=1, verbose=0, callbacks=[monitor])
    # truth: the optimizers themselves
    scales = {
        n: float(getattr(gan, n).dynamic_scale.numpy()) for n in ("d_optimizer", "g_optimizer")
    }
    assert all(v <= 1.0 for v in scales.values())
    assert int(gan.d_optimizer.iterations.numpy()) == 0
    findings = mpwatch.diagnose(str(tmp_path))
    (f,) = _of(findings, "loss-scale")
    assert f.severity == "error" and f.data["optimizers"] == scales
    assert run_summary(mpwatch.load_run(str(tmp_path)))["loss_scales"] == scales


def test_pure_float16_policy(trained):
    model, history, findings, _ = trained("float16_policy")
    hidden = [w for layer in model.layers[:-1] for w in layer.trainable_weights]
    assert {w.dtype for w in hidden} == {"float16"}  # truth: the weights themselves
    (f,) = _of(findings, "train-step")
    assert f.severity == "error" and f.data["cause"] == "variables_16bit"
    assert f.action == {"policy": "mixed_float16"}
    assert 'set_global_policy("mixed_float16")' in f.fix
    # the fix, applied: float32 variables, the finding gone, a lower loss
    fixed, fixed_history, fixed_findings, _ = trained("float16_policy", fixed=True)
    assert {w.dtype for w in fixed.trainable_weights} == {"float32"}
    assert _of(fixed_findings, "train-step") == []
    assert fixed_history.history["loss"][-1] < history.history["loss"][-1]


def test_bad_batches_named_by_step(cm, trained):
    model, history, findings, _ = trained("bad_batches")
    x, _ = cm.bad_batches_data()
    n = len(x) // cm.BATCH
    peaks = np.abs(x).reshape(n, -1).max(axis=1)
    truth = [i + 1 for i in range(n) if peaks[i] > 65504]  # steps (1 for the first batch)
    assert truth == list(cm.BAD_STEPS)
    (f,) = _of(findings, "bad-batches")
    assert f.severity == "error"
    assert f.data["steps"] == truth
    # the optimizer skipped exactly those steps: its iterations count the others
    assert int(model.optimizer.iterations.numpy()) == n - len(truth)
    assert f.data["skipped_steps"] == truth
    assert math.isnan(history.history["loss"][-1])  # what the user saw
    # never a layer dtype for a data problem, and no second finding for the same skips
    assert not [g for g in findings if g.action.get("dtype")]
    assert _of(findings, "skipped-steps") == [] and _of(findings, "activation-overflow") == []
    # the fix, applied (the records filtered): nothing skipped, a finite loss, no finding
    fixed, fixed_history, fixed_findings, _ = trained("bad_batches", fixed=True)
    assert _of(fixed_findings, "bad-batches") == []
    assert math.isfinite(fixed_history.history["loss"][-1])
    assert _errors(fixed_findings) == []


def test_unnormalized_inputs_the_checked_fix_is_normalization(cm, trained):
    model, history, findings, logdir = trained("unnormalized")
    x, _ = cm.unnormalized_data()
    assert float(np.abs(x).max()) > 2.0**15  # truth: raw amounts near float16's maximum
    (f,) = _of(findings, "input-range")
    assert f.severity == "error" and "Normalization" in f.fix
    checks = f.data["fix_checks"]
    # what the probe checked on that batch, re-done here by hand: at the probe's scale the raw
    # batch's scaled gradients overflow float16; the same batch normalized does not
    step, scale = f.data["step"], None
    run = mpwatch.load_run(logdir)
    for s, payload in run.records["probe"]:
        if s == step:
            scale = payload["loss_scale"]
    assert scale is not None and [c["fix"] for c in checks][0] == "none" and not checks[0]["finite"]
    norm_check = next(c for c in checks if c["fix"] == "normalize_inputs")
    assert norm_check["finite"]
    # never "keep a layer float32" for a range the inputs set: no layer fix offered or kept
    assert not [g for g in findings if g.action.get("dtype") == "float32"]
    assert _of(findings, "activation-overflow") == [] and _of(findings, "skipped-steps") == []
    # the fix, applied: a Normalization layer first; retrained, the finding is gone, no step is
    # skipped after the scale's descent, and the loss is finite and small
    fixed, fixed_history, fixed_findings, fixed_logdir = trained("unnormalized", fixed=True)
    assert _of(fixed_findings, "input-range") == []
    assert _errors(fixed_findings) == []
    causes = skip_causes(mpwatch.load_run(fixed_logdir))
    assert [c for c in causes if c.cause != "descent"] == []
    assert fixed_history.history["loss"][-1] < 1.0 < history.history["loss"][-1]
    # and it learns from the amounts: below chance (ln 2), its Normalization standardizing them as
    # numpy does (a float16 one, as the fix once read, gives 0 for them: a variance past 65504)
    assert fixed_history.history["loss"][-1] < 0.6 < math.log(2)
    norm = next(ly for ly in fixed.layers if type(ly).__name__ == "Normalization")
    x64 = x.astype(np.float64)
    want = (x64[:64] - x64.mean(axis=0)) / x64.std(axis=0)
    np.testing.assert_allclose(np.asarray(norm(x[:64]), np.float64), want, rtol=1e-3, atol=1e-3)


# --- every fix: printed and applied alike, both retrained with the problem gone ----------------
@pytest.mark.parametrize("name", ["custom_step", "gan", "float16_policy", "bad_batches",
                                  "unnormalized"])  # fmt: skip
def test_every_fix_printed_and_applied_alike(cm, trained, name):
    """Each model-changing finding: its printed code done on a fresh model (printed_fix, which
    reads only the text) and apply_recommendations (for a subclassed model: the fix's in-place
    form) give the same layer policies and optimizer; both retrain without the finding."""
    _, _, findings, logdir = trained(name)

    def retrain(model, f, label):
        cm.train(name, f"{logdir}_{label}", model=model)
        return f"{logdir}_{label}"

    build = lambda policy: cm.build(name, policy=policy)[0]  # noqa: E731
    def retrained(f):  # the device's float32 is one fix for all five: retrained on one
        return f.rule != "no-tensor-cores" or name == "custom_step"

    assert [c for c in every_fix_alike(findings, build, retrain, retrained) if c["left"]] == []


# --- the pre-flight (issue 53) of each model, against what its fit showed -----------------------
def _preflown(cm, name, tmp_path):
    keras.backend.clear_session()
    model, x, y = cm.build(name)
    bs = cm.BATCHES.get(name, cm.BATCH)
    return model, mpwatch.preflight(model, (x[:bs], y[:bs]), log_dir=str(tmp_path))


def test_preflight_of_the_cause_models(cm, trained, tmp_path):
    """What each fit showed (test_cause_models' fits above), before any fit: the unnormalized
    amounts are the inputs' range to normalize under float16, never a layer to keep float32;
    a custom train_step's scaling is said unchecked (the fit shows it unscaled); a model built
    under the pure float16 policy is recommended mixed_float16 (its fix); bad batches other than
    the one probed are said unchecked; a GAN, whose train_step runs sub-models, is refused in
    one line."""
    _, report = _preflown(cm, "unnormalized", tmp_path / "u")
    f16 = next(c for c in report.candidates if c.policy == "mixed_float16")
    assert [f.rule for f in f16.code_changes] == ["input-range"]
    assert f16.fix.float32_layers == ()
    assert f16.predictions["skips"] is True
    fitted, _, findings, _ = trained("unnormalized")
    assert _of(findings, "input-range")  # the fit's diagnosis names the same cause
    x = cm.build("unnormalized")[1]  # the skips predicted: the optimizer applied fewer steps
    steps = -(-len(x) // cm.BATCHES["unnormalized"]) * cm.EPOCHS["unnormalized"]
    assert int(fitted.optimizer.iterations.numpy()) < steps
    _, report = _preflown(cm, "custom_step", tmp_path / "c")
    assert any("custom train_step" in u for u in report.unchecked)
    ready = [c for c in report.candidates if c.verdict.startswith("ready")]
    assert ready and all("custom train_step" in c.reason for c in ready)
    model, report = _preflown(cm, "float16_policy", tmp_path / "f")
    assert model.dtype_policy.name == "float16"
    assert report.recommended == "mixed_float16" == cm.OWN_POLICY["float16_policy"][1]
    assert mpwatch.apply_recommendations(model, report.findings).policy == "mixed_float16"
    _, report = _preflown(cm, "bad_batches", tmp_path / "b")
    assert any(u.startswith("other batches") for u in report.unchecked)
    gan, x, _ = cm.build("gan")
    with pytest.raises(ValueError, match="no forward pass of its own"):
        mpwatch.preflight(gan, (x[:8],))
