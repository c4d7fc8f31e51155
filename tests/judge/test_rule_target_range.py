"""Rule ``target-range`` (mpwatch/judge/rules/target_range.py) on constructed Runs: a probe record
whose fix checks tried the batch's regression target standardised, numbers chosen here."""

from __future__ import annotations

import pytest
from test_rule_input_range import NONE, _check, _run

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
