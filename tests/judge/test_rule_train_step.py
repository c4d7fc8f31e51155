"""Rule ``train-step`` (mpwatch/judge/rules/train_step.py) on constructed Runs.

The gradients are numpy arrays of known magnitude: the float32 reference gradients ``ref``, and
what a train step hands the optimizer (``ref * S`` when it scales the loss, ``ref`` when it does
not, ``ref * S * S`` when it scales twice); the records hold their maxima as the recorders write
them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from builders import (
    assert_findings,
    findings_of,
    healthy_run,
    make_run,
    model_row,
    probe_layer,
)

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "train-step"
S = 32768.0


def _grads(seed=0):
    rng = np.random.default_rng(seed)
    return {f"dense_{i}/kernel": rng.normal(0, 10.0 ** -rng.integers(1, 5), size=(64, 8))
            for i in range(4)}  # fmt: skip


def _optimizer(name="optimizer", scaled=True, compiled=True, start=0, its=100, scale=S,
               inner="Adam", **more):  # fmt: skip
    cls = f"LossScaleOptimizer({inner})" if scaled else inner
    return {
        "name": name,
        "class": cls,
        "compiled": compiled,
        "loss_scaled": scaled,
        "iterations_start": start,
        "iterations": its,
        "loss_scale": scale if scaled else None,
        **more,
    }


def _with_gradients(run, factor, probe_steps=(50, 100), grad_steps=(40, 100), owner=None,
                    optimizers=None):  # fmt: skip
    """Probe variables (reference maxima) at ``probe_steps``; grad_variables (the optimizer's
    received maxima: reference x factor) at ``grad_steps``; a train_step record."""
    pv, gv = [], []
    for k, step in enumerate(probe_steps):
        for var, g in _grads(k).items():
            pv.append({"step": step, "variable": var, "layer": var.split("/")[0],
                       "ref_max_abs": float(np.abs(g).max())})  # fmt: skip
    for k, step in enumerate(grad_steps):
        for var, g in _grads(10 + k).items():  # other batches: other gradients, same magnitude
            gv.append({"step": step, "variable": var, "layer": var.split("/")[0],
                       "max_abs": float(np.abs(g * factor).max()), "loss_scale": S})  # fmt: skip
    run.probe_variables = pd.DataFrame(pv)
    run.grad_variables = pd.DataFrame(gv)
    run.train_step = {
        "custom_train_step": owner is not None,
        "train_step_owner": owner,
        "has_call": True,
        "optimizers": optimizers if optimizers is not None else [_optimizer()],
    }
    return run


def unscaled(inner="SGD", **more):
    return _with_gradients(
        healthy_run(), 1.0, owner="__main__.CustomModel",
        optimizers=[_optimizer(inner=inner, **more)],
    )  # fmt: skip


def never_called(calls, inner="SGD", **more):
    """No probe (a model without a forward pass of its own): the train step's trace called the
    LossScaleOptimizer's scale_loss ``calls`` times (None: not seen)."""
    run = _with_gradients(
        healthy_run(), 1.0, owner="__main__.VAE",
        optimizers=[_optimizer(inner=inner, scale_loss_calls=calls, **more)],
    )  # fmt: skip
    run.probe_variables = pd.DataFrame()
    run.train_step["has_call"] = False
    return run


def scaled():
    return _with_gradients(healthy_run(), S, owner="__main__.CustomModel")


def twice():
    return _with_gradients(healthy_run(), S * S, owner="__main__.CustomModel")


def gan():
    run = healthy_run()
    run.train_step = {
        "custom_train_step": True,
        "train_step_owner": "__main__.GAN",
        "has_call": False,
        "optimizers": [
            _optimizer(its=0),
            _optimizer("d_optimizer", scaled=False, compiled=False, its=60),
            _optimizer("g_optimizer", scaled=False, compiled=False, its=60),
        ],
    }
    return run


def gan_fixed():
    run = gan()
    for o in run.train_step["optimizers"][1:]:
        o.update(loss_scaled=True, **{"class": "LossScaleOptimizer(Adam)"})
    return run


def pure_float16():
    run = healthy_run()
    run.info = {**run.info, "policy": "float16", "compute_dtype": "float16",
                "variable_dtype": "float16", "loss_scale": {"kind": "none"}}  # fmt: skip
    run.layers["variable_dtype"] = "float16"
    run.layers["policy"] = "float16"
    run.scalars[contract.TRAIN_LOSS] = np.linspace(0.7, 9.0, len(run.scalars))
    run.train_step = {"custom_train_step": False, "train_step_owner": None, "has_call": True,
                      "optimizers": [_optimizer(scaled=False)]}  # fmt: skip
    return run


CASES = [
    pytest.param(
        unscaled(),
        [
            {
                "severity": "error",
                "title_has": ("CustomModel.train_step", "1/32768"),
                "fix_has": "scale_loss",
                "data": {"cause": "loss_not_scaled"},
            }
        ],  # fmt: skip
        id="custom-train-step-without-scale-loss",
    ),
    pytest.param(
        unscaled("Adam", epsilon=1e-7),
        [
            {
                "severity": "warning",
                "title_has": ("CustomModel.train_step", "Adam's updates shrink"),
                "evidence_has": ("S x epsilon = 0.00328", "flushing to zero"),
                "fix_has": "scale_loss",
                "data": {"cause": "loss_not_scaled"},
            }
        ],  # fmt: skip
        id="adam-without-scale-loss-a-warning",
    ),
    pytest.param(
        never_called(0),
        [
            {
                "severity": "error",
                "title_has": ("VAE.train_step", "1/32768"),
                "evidence_has": "never called optimizer.scale_loss",
                "data": {"cause": "loss_not_scaled", "scale_loss_calls": 0},
            }
        ],  # fmt: skip
        id="no-probe-the-trace-never-called-scale-loss",
    ),
    pytest.param(
        never_called(0, "Lion"),
        [
            {
                "severity": "warning",
                "title_has": "its float16 gradients have no loss scale",
                "data": {"cause": "loss_not_scaled"},
            }
        ],  # fmt: skip
        id="no-probe-lion-has-no-epsilon-floor",
    ),
    pytest.param(never_called(1), [], id="no-probe-the-trace-called-scale-loss"),
    pytest.param(never_called(None), [], id="no-probe-no-trace-seen-judges-nothing"),
    pytest.param(never_called(0, scale=1.0), [], id="no-probe-a-scale-of-one-changes-nothing"),
    pytest.param(scaled(), [], id="custom-train-step-that-scales"),
    pytest.param(
        twice(),
        [{"severity": "error", "title_has": "twice", "data": {"cause": "loss_scaled_twice"}}],
        id="scaled-twice",
    ),
    pytest.param(
        gan(),
        [
            {
                "severity": "error",
                "title_has": ("'d_optimizer'", "'g_optimizer'", "GAN.train_step"),
                "evidence_has": "never stepped",
                "fix_has": "LossScaleOptimizer(self.d_optimizer)",
                "data": {"cause": "optimizer_not_loss_scaled", "idle_compiled": True},
            }
        ],  # fmt: skip
        id="gan-two-unscaled-optimizers",
    ),
    pytest.param(gan_fixed(), [], id="gan-with-a-loss-scale-optimizer-each"),
    pytest.param(
        pure_float16(),
        [
            {
                "severity": "error",
                "title_has": "mixed_float16",
                "evidence_has": ("no optimizer scales the loss", "from 0.7 to 9"),
                "fix_has": 'set_global_policy("mixed_float16")',
                "action": {"policy": "mixed_float16"},
            }
        ],  # fmt: skip
        id="pure-float16-policy",
    ),
    pytest.param(healthy_run(), [], id="healthy-run-without-a-train-step-record"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_train_step(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_the_measured_ratio_is_the_factor_the_gradients_were_given():
    f = findings_of(diagnose(unscaled()), RULE)[0]
    # received/reference maxima of different batches of the same magnitude: log2 ratio near 0
    assert abs(f.data["log2_ratio"]) < 2.0
    f2 = findings_of(diagnose(twice()), RULE)[0]
    assert f2.data["log2_ratio"] == pytest.approx(30.0, abs=2.0)


def test_a_broken_contract_takes_in_the_findings_that_rest_on_it():
    """The false 'non-finite gradients' of a probe that assumed a scaled loss (an
    activation-overflow found only in the gradients) and the scale rules become evidence."""
    run = unscaled()
    layers = [probe_layer("dense_0", mx=3.0, nonfinite=True), probe_layer("dense_1", mx=3.0)]
    run.probe_layers = pd.DataFrame(
        [[100, *r] for r in layers], columns=["step", *contract.PROBE_LAYER_COLUMNS]
    )
    run.probe_model = pd.DataFrame([{"step": 100, **model_row(first="dense_0"), "nonfinite": 10}])
    alone = scaled()  # the same probe under a train step that keeps the contract: judged as is
    alone.probe_layers, alone.probe_model = run.probe_layers, run.probe_model
    assert [f.layer for f in diagnose(alone) if f.rule == "activation-overflow"] == ["dense_0"]
    found = diagnose(run)
    assert [f.rule for f in found if f.rule == "activation-overflow"] == []
    head = findings_of(found, RULE)[0]
    assert "activation-overflow" in head.data.get("also", [])


def test_a_forward_overflow_stays_its_own_finding():
    run = unscaled()
    layers = [probe_layer("dense_0", mx=float("inf"), nonfinite=True), probe_layer("dense_1")]
    run.probe_layers = pd.DataFrame(
        [[100, *r] for r in layers], columns=["step", *contract.PROBE_LAYER_COLUMNS]
    )
    run.probe_model = pd.DataFrame([{"step": 100, **model_row(first="dense_0")}])
    found = diagnose(run)
    assert [f.layer for f in found if f.rule == "activation-overflow"] == ["dense_0"]


def test_old_records_without_the_reference_maximum_judge_nothing():
    run = unscaled()
    run.probe_variables = run.probe_variables.drop(columns=["ref_max_abs"])
    assert findings_of(diagnose(run), RULE) == []


def test_a_small_scale_cannot_tell_scaled_from_unscaled():
    run = unscaled()
    run.grad_variables["loss_scale"] = 4.0
    assert findings_of(diagnose(run), RULE) == []


def test_make_run_stays_usable():  # the builder's defaults carry no train_step record
    assert make_run().train_step == {}


def test_dropout_noise_at_a_small_scale_is_not_called_scaling_twice():
    """The keras.io ViT under a float16 softmax: the scale fell to 16, and the training batches'
    gradients (Dropout on) run about 2^2 above the probe's reference (Dropout off). Once scaled
    at 16 with that noise is 2^6 = 16 x 4: not S² = 2^8, and too close to it to judge."""
    run = _with_gradients(healthy_run(), 16.0 * 4.0)
    run.grad_variables["loss_scale"] = 16.0
    assert findings_of(diagnose(run), RULE) == []


def test_pairs_at_different_scales_are_each_judged_at_their_own():
    """Probes near records at 2^15 and 2^9: the loss scaled once at each is judged once."""
    run = _with_gradients(healthy_run(), 1.0)
    first = run.grad_variables["step"] == run.grad_variables["step"].min()
    run.grad_variables.loc[first, "max_abs"] *= S
    run.grad_variables.loc[~first, "loss_scale"] = 2.0**9
    run.grad_variables.loc[~first, "max_abs"] *= 2.0**9
    assert findings_of(diagnose(run), RULE) == []


def test_an_adam_subclass_is_judged_by_its_family():
    """A user's subclass of Adam: the record's ``family`` says Adam (the Keras class it derives
    from), so its unscaled loss is Adam's warning, not the 1/S error a class name would give."""
    run = never_called(0, inner="MyAdam", family="Adam", epsilon=1e-7)
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "warning" and "Adam's updates shrink" in f.title
    old = never_called(0, inner="MyAdam", epsilon=1e-7)  # a record without the family
    (g,) = findings_of(diagnose(old), RULE)
    assert g.severity == "error" and "MyAdam gets every gradient 1/32768 of its size" in g.title


def test_rmsprop_s_floor_is_the_scale_times_the_root_of_its_epsilon():
    (f,) = findings_of(diagnose(never_called(0, inner="RMSprop", epsilon=1e-7)), RULE)
    assert f.severity == "warning" and "S x sqrt(epsilon) = 10.4" in f.evidence


def test_several_unscaled_optimizers_take_the_worst_consequence_and_each_its_fix():
    run = never_called(0, inner="Adam", epsilon=1e-7)
    run.train_step["optimizers"] += [
        _optimizer("d_optimizer", compiled=False, inner="SGD", scale_loss_calls=0),
    ]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "error" and "1/32768" in f.title
    assert f.data["optimizers"] == ["d_optimizer", "optimizer"]
    assert "self.d_optimizer.scale_loss(d_loss)" in f.fix
    assert "self.optimizer.scale_loss(loss)" in f.fix


def test_a_warning_root_takes_the_severity_of_the_errors_it_takes_in():
    """Adam's unscaled loss is a warning; the errors measured on a train step that does not
    exist (a gradient-only activation overflow here) become its evidence, and it an error."""
    run = unscaled("Adam", epsilon=1e-7)
    layers = [probe_layer("dense_0", mx=3.0, nonfinite=True), probe_layer("dense_1", mx=3.0)]
    run.probe_layers = pd.DataFrame(
        [[100, *r] for r in layers], columns=["step", *contract.PROBE_LAYER_COLUMNS]
    )
    run.probe_model = pd.DataFrame([{"step": 100, **model_row(first="dense_0"), "nonfinite": 10}])
    alone = scaled()
    alone.probe_layers, alone.probe_model = run.probe_layers, run.probe_model
    (overflow,) = [f for f in diagnose(alone) if f.rule == "activation-overflow"]
    found = diagnose(run)
    (head,) = findings_of(found, RULE)
    assert "activation-overflow" in head.data["also"]
    assert head.severity == "error" == overflow.severity


def test_a_model_without_a_forward_pass_gets_a_fix_that_keeps_its_own_loss():
    """keras.io's VQ-VAE trainer (its train_step runs self.vqvae): no ``self(x)`` to call, so
    the fix keeps the step's own forward pass and loss and scales that; a model with one gets
    Keras' own pattern."""
    (f,) = findings_of(diagnose(never_called(0)), RULE)
    assert "self(x" not in f.fix and "compute_loss" not in f.fix
    assert "scaled_loss = self.optimizer.scale_loss(loss)" in f.fix
    assert "tape.gradient(scaled_loss, variables)" in f.fix
    run = never_called(0)
    run.train_step["has_call"] = True
    (f,) = findings_of(diagnose(run), RULE)
    assert "y_pred = self(x, training=True)" in f.fix
