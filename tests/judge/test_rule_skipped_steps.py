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


# --- the descent bounded by the float32 reference (the probe's sweep) -------------------------
def _reference_run(model_overflows, steps, probe_step, first, ref_max_log2):
    """A mixed_float16 run whose float16 model overflows where ``model_overflows(step, scale)``
    says (Keras' rule step by step) and a float16 probe at ``probe_step`` whose float32 reference
    gradients are numpy samples with max |g| = 2**ref_max_log2 (its sweep computed from them),
    its own pass non-finite first in ``first`` (None: finite)."""
    import numpy as np
    from builders import grad_probe, scale_run

    scales, skipped = keras_scale_history(steps, model_overflows)
    g = np.random.default_rng(3).uniform(-1.0, 1.0, 4000) * 2.0**ref_max_log2
    g[0] = 2.0**ref_max_log2
    probe = grad_probe(probe_step, {"dense": g}, scales[probe_step - 1])
    probe["model"]["first_nonfinite_layer"] = first
    return scale_run([probe], scales, skipped), scales, skipped


def test_the_descent_ends_where_the_float32_twin_would_stop():
    """The float32 twin's weight gradients peak at 2^5, its activation gradients 2 bits higher,
    so a sound model with them skips every scale >= 2^16 / 2^7 = 2^9 (Keras' rule run for the
    twin here); the float16 model (a float16 softmax) overflows at every scale above 1, and the
    probe saw its pass go non-finite first in 'predictions'. The skips the twin makes too are the
    descent; the rest are that layer's."""
    from mpwatch.judge.evidence.skip_causes import skip_causes

    run, scales, skipped = _reference_run(lambda s, sc: sc > 1.0, 40, 30, "predictions", 5)
    _, twin_skipped = keras_scale_history(40, lambda s, sc: sc * 2.0**7 >= 2.0**16)
    twin = [s for s, v in twin_skipped.items() if v]
    assert [scales[s - 1] for s in twin] == [2.0**k for k in range(15, 8, -1)]
    causes = skip_causes(run)
    assert [c.step for c in causes if c.cause == "descent"] == twin
    rest = [c for c in causes if c.cause != "descent"]
    assert rest and all(c.cause == "model_overflow" and "'predictions'" in c.detail for c in rest)
    assert sorted(c.step for c in causes) == [s for s, v in skipped.items() if v]


def test_skips_where_the_twin_fits_are_no_descent_and_say_so():
    """The float32 twin's gradients peak at 2^-2: they would fit at every scale up to 2^17 (and
    2^15 with the 2 bits of activation margin), so a sound model skips none; the float16 model
    overflows on its first 13 training batches at any scale above 16, and the probe's own batch
    was finite. Every skip is the model's, none the descent's, and the fix is no 'start the
    scale lower' (the twin needs none)."""
    from mpwatch.judge.evidence.skip_causes import TWIN_FITS, skip_causes

    run, scales, skipped = _reference_run(lambda s, sc: s <= 13 and sc > 16.0, 30, 20, None, -2)
    _, twin_skipped = keras_scale_history(30, lambda s, sc: sc * 2.0**0 >= 2.0**16)
    assert not any(twin_skipped.values())
    causes = skip_causes(run)
    want = [s for s, v in skipped.items() if v]
    assert len(want) == 11  # 2^15 down to 2^5
    assert [c.step for c in causes] == want
    assert all(c.cause == "model_overflow" and c.detail.startswith(TWIN_FITS) for c in causes)
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["early"] == 0 and f.data["skipped"] == 11
    assert "11 at scales the float32 reference's gradients fit" in f.evidence
    assert "after it" not in f.evidence  # there is no descent for it to follow
    assert "initial_scale" not in f.fix and "probe_data" in f.fix
    # all 11 are the skips the run starts with: judged by their number (more than 10: a
    # warning), not as a rate over this 30-step fit's length
    assert f.severity == "warning" and f.data["later"] == 0


@pytest.mark.parametrize("steps", [20, 2000])
def test_a_start_the_twin_fits_that_then_holds_is_no_finding_whatever_the_fit_length(steps):
    """keras.io's LSTM forecaster (target normalized): its float16 pass overflows from 2^12 on
    every batch, its float32 twin's weight gradients would fit up to 2^17. The scale falls from
    2^15 to 2^11 in the first 4 steps and holds. The 3 skips below the twin's bound are the
    model's (said as such), but they cost 3 steps once: on a 20-step fit that was "3 of 19 steps
    skipped (15.8%)", an ERROR that on a 2000-step fit would be 0.15%. Their cost in scale is
    the scale rules'."""
    from mpwatch.judge.evidence.skip_causes import TWIN_FITS, skip_causes

    run, scales, skipped = _reference_run(lambda s, sc: sc >= 2.0**12, steps, 10, None, -1)
    assert [s for s, v in skipped.items() if v] == [1, 2, 3, 4]
    assert scales[steps] == 2.0**11
    causes = skip_causes(run)
    assert [c.cause for c in causes] == ["descent"] + ["model_overflow"] * 3
    assert all(c.detail.startswith(TWIN_FITS) for c in causes[1:])
    assert findings_of(diagnose(run), RULE) == []
    # the same start, then a skip every 4th step: those are judged as a rate
    run, _, skipped = _reference_run(
        lambda s, sc: sc >= 2.0**12 or (s > steps // 2 and s % 4 == 0), steps, 10, None, -1
    )
    (f,) = findings_of(diagnose(run), RULE)
    later = [c.step for c in skip_causes(run) if c.step > 4 and c.cause != "descent"]
    assert len(later) == len([s for s, v in skipped.items() if v and s > 4]) > 0
    assert f.data["later"] == len(later) and f.severity == "error"


@pytest.mark.parametrize(
    "loss_at, says",
    [
        ("finite", "the loss was finite on these\n# batches: the backward pass overflows"),
        ("inf at step 3", "the loss itself is not finite"),
        (None, "the forward or the backward pass"),
    ],
    ids=["loss-finite-backward", "loss-inf-forward", "no-loss-recorded"],
)
def test_a_descent_past_a_scale_of_one_names_the_pass_the_loss_shows(loss_at, says):
    """16 skips from 2^15: even scales of 1 and below overflowed. Which pass did is read from the
    loss Keras reported at those steps (its running mean keeps a non-finite batch's loss), not
    guessed: "the forward pass itself is not finite" was said of a run whose loss was finite on
    every batch (a float16 softmax's backward pass overflowed)."""
    sk = {s: 1.0 if s <= 16 else 0.0 for s in range(1, 301)}
    scalars = {contract.STEP_SKIPPED: sk}
    if loss_at is not None:
        loss = {s: 0.7 for s in range(1, 301)}
        if loss_at.startswith("inf"):
            loss.update({s: float("inf") for s in range(3, 301)})
        scalars[contract.TRAIN_LOSS] = loss
    (f,) = findings_of(diagnose(make_run(scalars=scalars)), RULE)
    assert says in f.fix, f.fix
    assert ("stayed finite at every one" in f.evidence) == (loss_at == "finite")
