"""Rule ``skipped-steps`` (mpwatch/judge/rules/skipped_steps.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, keras_scale_history, make_run

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "skipped-steps"


def _every(every):
    """Steps 1..1100: the first 10 skipped (the scale's descent), then every ``every``-th."""
    sk = {s: 1.0 if (s <= 10 or s % every == 0) else 0.0 for s in range(1, 1101)}
    return make_run(scalars={contract.STEP_SKIPPED: sk})


def _after(every):
    """(skips, steps) after the scale's descent (the 10 consecutive skips the run starts with),
    counted from the flags as _every wrote them."""
    return sum(1 for s in range(11, 1101) if s % every == 0), 1100 - 10


def _early(early):
    """Steps 1..300: the first ``early`` skipped, none after."""
    sk = {s: 1.0 if s <= early else 0.0 for s in range(1, 301)}
    return make_run(scalars={contract.STEP_SKIPPED: sk})


# only the cumulative count, every 10 steps: 10 skips in warm-up, then one every 10 steps
_TOTALS = {s: float(10 + (s - 100) // 10) if s > 100 else 10.0 for s in range(10, 1101, 10)}

CASES = [
    pytest.param(_every(200), [], id="rate-0.5%-is-fine"),
    pytest.param(
        _every(50),
        [{"severity": "warning", "data": {"skipped": _after(50)[0], "steps": _after(50)[1]}}],
        id="rate-2%-warning",
    ),
    pytest.param(
        _every(5),
        [{"severity": "error", "data": {"skipped": _after(5)[0], "steps": _after(5)[1]}}],
        id="rate-20%-error",
    ),
    pytest.param(
        make_run(scalars={contract.SKIPPED_STEPS_TOTAL: _TOTALS}),
        [{"data": {"skipped": 100, "steps": 1000}}],
        id="from-totals-without-per-step-flag",
    ),
    pytest.param(_early(10), [], id="10-in-warm-up-is-the-scales-descent"),
    pytest.param(
        _early(12), [{"severity": "warning", "data": {"early": 12}}], id="12-in-warm-up-warning"
    ),
    pytest.param(
        _early(16), [{"severity": "error", "data": {"early": 16}}], id="16-in-warm-up-error"
    ),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_skipped_steps(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_the_scales_that_overflowed_largest_and_when():
    # Keras' rule: 12 skips at the start (2^15 down to 8), then a failed doubling at 2^4 after
    # 2000 finite steps, and every 50th step from 2500 on overflowing at any scale
    def over(step, scale):
        return step <= 12 or scale >= 16 or (step >= 2500 and step % 50 == 0)

    scales, skipped = keras_scale_history(3000, over)
    run = make_run(scalars={contract.LOSS_SCALE: scales, contract.STEP_SKIPPED: skipped})
    (f,) = findings_of(diagnose(run), RULE)
    # ground truth: the scale each skipped step ran at is the one in effect before it
    ran_at = {s: scales[s - 1] for s, k in skipped.items() if k}
    top = max(ran_at.values())
    first_top = min(s for s, v in ran_at.items() if v == top)
    assert (f.data["max_overflow_scale"], f.data["max_overflow_step"]) == (top, first_top)
    assert f.data["min_overflow_scale"] == min(ran_at.values())
    assert top == 2.0**15 and first_top == 1
    assert "2^15 (32768) at step 1" in f.evidence
    assert f.data["total"] == len(ran_at)


def test_a_descent_with_finite_steps_between_says_what_it_counts():
    # EfficientNetB0 under a float16 softmax (tests/realmodels/test_more_models.py): 13 skips
    # from step 1, a finite step 14, then skips at new lowest scales at steps 15, 16 and 20: all
    # 16 are the scale's descent (skip_causes), and only 13 came before the first finite step
    def over(step, scale):
        return step <= 13 or step in (15, 16, 20)

    scales, skipped = keras_scale_history(20, over)
    run = make_run(scalars={contract.LOSS_SCALE: scales, contract.STEP_SKIPPED: skipped})
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["early"] == 16 and f.severity == "error"
    first_finite = min(s for s, k in skipped.items() if not k)
    assert first_finite == 14  # so "16 steps skipped before the first finite step" is false
    assert "before the first finite step" not in f.title
    assert f.title == "16 steps skipped while the loss scale fell from 2^15 (32768) to 0.5"
    assert scales[20] == 0.5  # Keras' own scale after the 16 halvings
