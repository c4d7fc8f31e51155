"""Rule ``target-range`` (mpwatch/judge/rules/target_range.py) on constructed Runs: a probe record
whose fix checks tried the batch's regression target standardised, numbers chosen here."""

from __future__ import annotations

import re

import pytest
from test_rule_input_range import NONE, _check, _run

from mpwatch import contract
from mpwatch.judge import diagnose
from mpwatch.judge.rules.target_range import float16_step

TARGET = {"mean": 1000.0, "std": 21.9, "max_abs": 1035.0}


def _target(finite):
    return {**_check("normalize_target", [], finite), "target": TARGET}


def test_the_standardised_target_in_range_names_the_target_and_takes_in_the_rest():
    checks = [NONE, _check("float32_layers", ["hidden1"], True),
              _check("normalize_inputs", [], True), _target(True)]  # fmt: skip
    found = diagnose(_run(checks))
    (f,) = [f for f in found if f.rule == "target-range"]
    assert f.severity == "error" and "(y_train - y_mean) / y_std" in f.fix
    assert "standardising the target: finite, in range" in f.evidence
    assert "mean 1000, standard deviation 21.9, |y| up to 1035" in f.evidence
    assert "only to steps of 1" in f.evidence  # float16 between 1024 and 2048: steps of 1
    assert f.data["target"] == TARGET and not f.action  # a change to the data, not the model


@pytest.mark.parametrize(
    "checks",
    [
        [NONE, _check("float32_layers", ["hidden1"], True), _target(False)],  # does not fix it
        [NONE, _check("float32_layers", ["hidden1"], True)],  # not tried (no raw target)
        [{**NONE, "finite": True, "in_range": True}, _target(True)],  # nothing to fix
    ],
)
def test_no_finding_where_the_target_is_not_shown_to_be_the_cause(checks):
    assert [f for f in diagnose(_run(checks)) if f.rule == "target-range"] == []


def test_float16_step_is_the_spacing_of_float16_values():
    import numpy as np

    for v in (0.7, 3.0, 1000.0, 1035.0, 40000.0):
        here = np.float16(v)
        assert float16_step(v) == float(np.nextafter(here, np.float16(np.inf)) - here)


def test_a_target_past_float16s_maximum_is_said_to_be_out_of_its_range():
    checks = [NONE, {**_target(True), "target": {"mean": 2.95e5, "std": 81591.0,
                                                  "max_abs": 4.7e5}}]  # fmt: skip
    (f,) = [f for f in diagnose(_run(checks)) if f.rule == "target-range"]
    assert re.search(r"a float16 output cannot hold (470000|4\.70e\+05) at all \(its maximum is "
                     r"65504\)", f.evidence), f.evidence
    assert "steps of" not in f.evidence


def test_a_float16_normalizations_lost_features_stay_a_finding_of_their_own():
    """The input-range finding about a float16 Normalization's cast constants is another cause
    (features lost at any scale), never the target's evidence; its "normalize the inputs" one
    is."""
    run = _run([NONE, _check("float32_layers", ["hidden1"], True), _target(True)])
    run.records[contract.KIND_LAYERS] = [(0, {"layers": {}, "cast_constants": {
        "norm": {"dtype": "float16", "features": 4, "lost": 1}}})]  # fmt: skip
    found = diagnose(run)
    (lost,) = [f for f in found if f.rule == "input-range"]
    assert lost.layer == "norm" and lost.severity == "error"
    (f,) = [f for f in found if f.rule == "target-range"]
    assert "input-range" not in f.data.get("also", [])
