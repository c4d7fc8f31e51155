"""Rule ``input-range`` (mpwatch/judge/rules/input_range.py) and the fix checks every layer fix is
held to (mpwatch/judge/evidence/fix_checks.py, ``folds.checked_fixes``), on constructed Runs: a
probe
record with the checks the probe ran on its batch, and overflow findings about the same layers."""

from __future__ import annotations

import pandas as pd
import pytest
from builders import findings_of, healthy_run, make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.judge import diagnose

NONE = {"fix": "none", "layers": [], "finite": False, "first_nonfinite_layer": "hidden1",
        "max_abs_activation_16bit": 35040.0, "loss": None}  # fmt: skip


def _check(fix, layers, finite, first=None, peak=10.0):
    return {"fix": fix, "layers": layers, "finite": finite, "first_nonfinite_layer": first,
            "max_abs_activation_16bit": peak, "loss": 0.7 if finite else None}  # fmt: skip


def _run(checks, first="hidden1"):
    """A run whose probe at step 8 found 'hidden1' non-finite and checked ``checks``."""
    run = healthy_run()
    layers = [probe_layer("hidden1", mx=float("inf"), nonfinite=True), probe_layer("hidden2"),
              probe_layer("hidden3")]  # fmt: skip
    run.probe_layers = pd.DataFrame(
        [[8, *r] for r in layers], columns=["step", *contract.PROBE_LAYER_COLUMNS]
    )
    run.probe_model = pd.DataFrame([{"step": 8, **model_row(first=first)}])
    run.records[contract.KIND_PROBE] = [(8, {"loss_scale": 256.0, "fix_checks": checks})]
    run.probe_inputs = pd.DataFrame([{"step": 8, "input": "amounts", "max_abs": 59686.8}])
    return run


def _layer_fix(found, layer):
    return [f for f in found if f.layer == layer and f.rule == "activation-overflow"]


def test_normalizing_fixes_what_no_layer_does_so_the_inputs_are_the_cause():
    checks = [NONE,
              _check("float32_layers", ["hidden1"], False, "hidden2"),
              _check("float32_layers", ["hidden1", "hidden2"], False, "hidden3"),
              _check("float32_layers", ["hidden1", "hidden2", "hidden3"], True),
              _check("normalize_inputs", [], True, peak=1.76)]  # fmt: skip
    found = diagnose(_run(checks))
    (f,) = findings_of(found, "input-range")
    assert f.severity == "error" and "Normalization" in f.fix
    for part in (
        "step 8's batch",
        "2^8 (256)",
        "keeping 'hidden1' float32: still not finite (at 'hidden2')",
        "normalizing the inputs: finite",
        "'amounts' reaches 59687",
    ):
        assert part in f.evidence, (part, f.evidence)
    # the layer findings are its evidence, never a fix of their own
    assert _layer_fix(found, "hidden1") == []
    assert "activation-overflow" in f.data["also"]
    assert not [g for g in found if g.action.get("dtype") == "float32"]


def test_a_layer_fix_the_probe_saw_work_is_offered_with_what_was_checked():
    checks = [NONE, _check("float32_layers", ["hidden1"], True),
              _check("normalize_inputs", [], True)]  # fmt: skip
    found = diagnose(_run(checks))
    assert findings_of(found, "input-range") == []  # one layer fixes it: not the inputs' range
    (f,) = _layer_fix(found, "hidden1")
    assert f.action == {"dtype": "float32"}
    assert "keeping 'hidden1' float32: finite" in f.evidence
    assert f.data["checked_layers"] == ["hidden1"]


def test_a_layer_fix_that_needed_the_next_layer_too_grows_to_it(policy):
    checks = [NONE,
              _check("float32_layers", ["hidden1"], False, "hidden2"),
              _check("float32_layers", ["hidden1", "hidden2"], True),
              _check("normalize_inputs", [], False, "hidden1")]  # fmt: skip
    found = diagnose(_run(checks))
    (f,) = _layer_fix(found, "hidden1")
    assert 'name="hidden1"' in f.fix and 'name="hidden2"' in f.fix
    assert "apply_recommendations" in f.fix
    # what is printed is what is applied: both layers float32 in the model apply gives (it set
    # hidden1 alone when the checks wrote the grown set under a key applying did not read)
    import keras

    import mpwatch

    with policy("mixed_float16"):
        inp = keras.Input((4,))
        h = keras.layers.Dense(8, name="hidden1")(inp)
        h = keras.layers.Dense(8, name="hidden2")(h)
        h = keras.layers.Dense(8, name="hidden3")(h)
        model = keras.Model(inp, keras.layers.Dense(1, dtype="float32", name="out")(h))
    fixed = mpwatch.apply_recommendations(model, found)
    policies = {ly.name: ly.dtype_policy.name for ly in fixed.model.layers[1:]}
    assert policies == {"hidden1": "float32", "hidden2": "float32", "hidden3": "mixed_float16",
                        "out": "float32"}  # fmt: skip


def test_a_layer_fix_that_did_not_fix_is_not_offered():
    checks = [NONE,
              _check("float32_layers", ["hidden1"], False, "hidden2"),
              _check("float32_layers", ["hidden1", "hidden2"], False, "hidden3"),
              _check("normalize_inputs", [], False, "hidden1")]  # fmt: skip
    found = diagnose(_run(checks))
    (f,) = _layer_fix(found, "hidden1")
    assert f.action == {} and f.data["checked_layers"] is None
    assert "did not make it finite" in f.fix
    assert findings_of(found, "input-range") == []


@pytest.mark.parametrize("checks", [None, []], ids=["no-checks-recorded", "nothing-to-fix"])
def test_without_checks_the_advice_stands_as_before(checks):
    run = _run(checks or [])
    if checks is None:
        run.records[contract.KIND_PROBE] = [(8, {"loss_scale": 256.0})]
    (f,) = _layer_fix(diagnose(run), "hidden1")
    assert f.action == {"dtype": "float32"} and "checked" not in f.evidence


def test_activations_only_near_the_maximum_is_a_warning_with_what_was_checked():
    near = {**NONE, "finite": True, "in_range": False, "first_nonfinite_layer": None}
    checks = [near,
              {**_check("float32_layers", ["hidden1"], True, peak=32304.0), "in_range": False},
              {**_check("float32_layers", ["hidden1", "hidden2", "hidden3"], True, peak=0.0),
               "in_range": True},
              {**_check("normalize_inputs", [], True, peak=1.8), "in_range": True}]  # fmt: skip
    (f,) = findings_of(diagnose(_run(checks, first=None)), "input-range")
    assert f.severity == "warning" and "within 2^3 of float16's maximum" in f.title
    assert "as it is, 16-bit activations reach 35040" in f.evidence
    assert "keeping 'hidden1' float32: finite, but 16-bit activations still reach 32304" in (
        f.evidence
    )


STOPPED = {"fix": "stopped", "layers": [],
           "reason": "mpwatch's cost budget: the next pass was estimated at 4.10 s, 0.30 s of "
                     "the budget left"}  # fmt: skip


def test_checks_the_budget_stopped_leave_the_advice_unchecked_not_refuted():
    # hidden1 alone did not fix it; the next candidate (hidden1 + hidden2) was never run
    checks = [NONE, _check("float32_layers", ["hidden1"], False, "hidden2"), STOPPED]
    found = diagnose(_run(checks))
    (f,) = _layer_fix(found, "hidden1")
    assert f.action == {"dtype": "float32"}  # the rule's advice stands: not shown as failing
    assert "did not make it finite" not in f.fix
    assert "the checks stopped here (mpwatch's cost budget" in f.evidence
    assert "not checked" in f.evidence and f.data["fix_unchecked"].startswith("mpwatch's cost")
    assert findings_of(found, "input-range") == []  # normalizing was not reached: no claim


def test_a_fix_seen_working_before_the_checks_stopped_is_still_offered():
    checks = [NONE, _check("float32_layers", ["hidden1"], True), STOPPED]
    (f,) = _layer_fix(diagnose(_run(checks)), "hidden1")
    assert f.action == {"dtype": "float32"} and f.data["checked_layers"] == ["hidden1"]
    assert "fix_unchecked" not in f.data


def test_checks_stopped_before_their_first_pass_do_not_hide_an_earlier_probes():
    run = _run([NONE, _check("float32_layers", ["hidden1"], False, "hidden2"),
                _check("float32_layers", ["hidden1", "hidden2"], True)])  # fmt: skip
    run.records[contract.KIND_PROBE].append((16, {"loss_scale": 256.0, "fix_checks": [STOPPED]}))
    (f,) = _layer_fix(diagnose(run), "hidden1")
    assert f.action["float32_layers"] == ["hidden1", "hidden2"] and "step 8's batch" in f.evidence


def test_a_gradient_check_the_budget_skipped_is_said_and_the_advice_stands():
    run = _gradient_run(None)
    run.records[contract.KIND_PROBE][0][1]["grad_fix_checks"][0]["skipped"] = STOPPED["reason"]
    (f,) = findings_of(diagnose(run), "gradient-error")
    assert f.action == {"dtype": "float32"} and f.severity != "info"
    assert "did not check 'hidden2' in float32 (mpwatch's cost budget" in f.evidence
    assert f.data["checked_fixed"] is None


def _gradient_run(after):
    """A run whose probe flags 'hidden2''s gradient (12% off, the others 0.1%) and re-ran the
    pass with it in float32: its error then is ``after``."""
    run = healthy_run()
    layers = [probe_layer("hidden1", mx=10.0), probe_layer("hidden2", mx=10.0),
              probe_layer("hidden3", mx=10.0)]  # fmt: skip
    for row in layers:
        row[4] = 0.12 if row[0] == "hidden2" else 0.001  # grad_rel_error
    run.probe_layers = pd.DataFrame(
        [[8, *r] for r in layers], columns=["step", *contract.PROBE_LAYER_COLUMNS]
    )
    run.probe_model = pd.DataFrame([{"step": 8, **model_row()}])
    run.records[contract.KIND_PROBE] = [
        (8, {"loss_scale": 256.0,
             "grad_fix_checks": [{"layer": "hidden2", "before": 0.12, "after": after}]})
    ]  # fmt: skip
    return run


def test_a_gradient_fix_the_probe_saw_work_is_offered_with_what_was_checked():
    (f,) = findings_of(diagnose(_gradient_run(0.002)), "gradient-error")
    assert f.layer == "hidden2" and f.action == {"dtype": "float32"}
    assert "keeping 'hidden2' float32 brings its gradient error from 12.0% to 0.20%" in f.evidence


def test_a_gradient_fix_that_leaves_the_error_is_withdrawn():
    (f,) = findings_of(diagnose(_gradient_run(0.11)), "gradient-error")
    assert f.severity == "info" and f.action == {} and "does not fix" in f.title
    assert "leaves its gradient error at 11.0% (from 12.0%)" in f.evidence


# --- a float16 Normalization whose cast mean or variance lost features (layers record) ---------
def _lost_run(lost=4, with_bad_batches=False):
    from builders import graph_row

    rows = [graph_row("norm", "Normalization", inputs=["input_layer"], params=0),
            graph_row("dense", inputs=["norm"], act="relu", width=8, dims={"units": 8}),
            graph_row("out", inputs=["dense"], width=1, dims={"units": 1}, out=True,
                      dtype="float32")]  # fmt: skip
    scalars = {}
    if with_bad_batches:  # every batch past float16's range, into the same layer
        scalars = {contract.INPUT_MAX_ABS: {s: 3e5 for s in range(1, 21)},
                   contract.INPUT_NONFINITE_COUNT: {1: 0.0}}  # fmt: skip
    run = make_run(layers=rows, scalars=scalars)
    payload = {"layers": {}, "class_modules": {"Normalization": "keras.src.layers"}}
    if lost:
        payload["cast_constants"] = {"norm": {"dtype": "float16", "features": 8, "lost": lost}}
    run.records[contract.KIND_LAYERS] = [(0, payload)]
    return run


def test_a_float16_normalization_that_lost_features_is_an_error_on_that_layer():
    (f,) = findings_of(diagnose(_lost_run()), "input-range")
    assert f.severity == "error" and f.layer == "norm" and f.action == {"dtype": "float32"}
    assert "4 of 8 features come out 0" in f.title
    assert 'keras.layers.Normalization(..., dtype="float32", name="norm")' in f.fix
    assert 'model.get_layer("norm").finalize_state()' in f.fix
    assert findings_of(diagnose(_lost_run(lost=0)), "input-range") == []


def test_the_same_layer_taking_raw_features_past_float16_is_one_finding():
    found = diagnose(_lost_run(with_bad_batches=True))
    (f,) = findings_of(found, "input-range")
    assert findings_of(found, "bad-batches") == []  # merged into it: one cause, one finding
    assert "bad-batches" in f.data["also"]


def test_a_layer_fix_stands_unchecked_where_only_the_scaled_gradients_overflowed():
    """DenseNet121 on raw pixels at Keras' start 2^15: the forward pass finite, the scaled
    gradients not, with and without each change: the scale is too high for the batch (Keras
    lowers it), so the checks neither confirm nor withdraw the layer's advice."""
    base = dict(NONE, first_nonfinite_layer="gradients")
    checks = [base, _check("float32_layers", ["hidden1"], False, "gradients"),
              _check("normalize_inputs", [], False, "gradients")]  # fmt: skip
    found = diagnose(_run(checks))
    (f,) = _layer_fix(found, "hidden1")
    assert f.action == {"dtype": "float32"}
    assert "did not make it finite" not in f.fix
    assert "only the scaled gradients overflow" in f.evidence
    assert f.data["fix_unchecked"] == "only the scaled gradients overflowed"
    # one change that does make them finite is still a checked fix
    grown = [base, _check("float32_layers", ["hidden1"], False, "gradients"),
             _check("float32_layers", ["hidden1", "hidden2"], True)]  # fmt: skip
    (g,) = _layer_fix(diagnose(_run(grown)), "hidden1")
    assert g.data["checked_layers"] == ["hidden1", "hidden2"]
