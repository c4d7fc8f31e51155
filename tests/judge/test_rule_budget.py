"""Rule ``budget`` (mpwatch/judge/rules/budget.py) on constructed Runs: what the budget skipped,
and a probe it let run beyond its share because the training looked broken."""

from __future__ import annotations

from builders import findings_of, make_run

from mpwatch.judge import diagnose

RULE = "budget"


def _budget(*decisions):
    return {
        "step": 24, "fraction": 0.05, "fit_seconds": 10.0, "own_seconds": 2.5,
        "spent": {"probe": 2.0, "run_info": 0.5}, "decisions": list(decisions), "explicit": {},
    }  # fmt: skip


def _decision(step, action, reason, cost=None):
    return {
        "step": step, "part": "probe", "action": action, "estimate_s": 2.0,
        "allowance_s": 0.4, "cost_s": cost, "reason": reason, "detail": {},
    }  # fmt: skip


def test_a_probe_a_broken_training_needed_is_said_with_why_and_what_it_cost():
    run = make_run()
    reason = "the training loss is nan: it finds the cause, whatever it costs"
    run.budgets = [_budget(_decision(12, "needed", reason, cost=1.9))]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "info"
    assert f.title.endswith("ran beyond mpwatch's cost budget: the training loss is nan")
    assert f.evidence == f"it ran beyond the budget at step 12 (1.9 s): {reason}"
    assert f.data["needed"] == 1


def test_a_skip_after_it_is_one_finding_that_says_both():
    run = make_run()
    run.budgets = [
        _budget(
            _decision(12, "needed", "the loss scale has fallen to 0.5: even an unscaled pass"),
            _decision(24, "skipped", "estimated 2.00 s, 0.40 s of the budget left"),
        )
    ]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["skipped"] == 1 and f.data["ran"] == 1
    assert "ran at 1 of 2 chances" in f.title
    assert "it ran beyond the budget at step 12: the loss scale has fallen to 0.5" in f.evidence


def test_nothing_skipped_nothing_needed_is_no_finding():
    run = make_run()
    run.budgets = [_budget(_decision(12, "ran", "fits the budget", cost=0.3))]
    assert findings_of(diagnose(run), RULE) == []


def test_fix_checks_the_budget_stopped_are_their_own_finding_beside_a_probe_that_ran():
    run = make_run()
    stopped = {**_decision(12, "skipped", "mpwatch's cost budget: the next pass was estimated "
                           "at 2.00 s, 0.40 s of the budget left"), "part": "fix_checks"}
    run.budgets = [_budget(_decision(12, "ran", "fits the budget", cost=0.9), stopped)]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["part"] == "fix_checks" and f.data["skipped"] == 1
    assert f.title.startswith("The probe's fix checks did not run to their end")
    assert f.evidence.startswith("the probe's fix checks were skipped at 1 of 1 chances")
    assert "a fix past that point is advice not checked" in f.evidence
    assert "probe_every=N" in f.fix
