"""The probe's fix checks under the cost budget (mpwatch/record/probe/fix_gate.py): each pass asked
for before it runs, a refused one stops the checks, and the record, the budget's decisions and the
diagnosis say how far they went. Ground truth: the full checks of the same probe without a gate,
the event files read back, and Keras' own weights."""

from __future__ import annotations

import numpy as np
import pytest

from mpwatch.record.probe.fix_gate import FixGate

keras = pytest.importorskip("keras")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_pass_is_estimated_by_its_program_then_the_dearest_then_the_first_guess():
    clock = _Clock()
    gate = FixGate(allowance=10.0, started=0.0, first_estimate=2.0, reserve=1.0, clock=clock)
    assert gate.estimate(("float32",)) == 2.0  # nothing measured: the first guess
    assert gate.allow(("float32",))
    gate.ran(("float32",), 3.0)
    clock.now = 3.0
    assert gate.estimate(("float32", "d1")) == 3.0  # a new program: the dearest so far
    gate.ran(("float32", "d1"), 0.5)
    assert gate.estimate(("float32", "d1")) == 0.5  # its own cost, once known
    assert gate.left() == 10.0 - 1.0 - 3.0
    clock.now = 8.5  # 10 - 1 reserved - 8.5 spent: 0.5 s left
    assert gate.allow(("float32", "d1"))  # 0.5 fits
    assert not gate.allow(("float32", "d1", "d2"))  # 3.0 does not
    assert not gate.allow(("float32", "d1"))  # once stopped, nothing after it runs
    assert gate.reason() == (
        "mpwatch's cost budget: the next pass was estimated at 3.00 s, 0.50 s of the budget left"
    )
    d = gate.decision()
    assert d["action"] == "skipped" and d["estimate"] == 3.0 and d["cost"] is None
    assert d["detail"] == {"ran_seconds": 3.5}


def test_a_free_gate_runs_every_pass_and_a_gate_never_asked_keeps_no_decision():
    free = FixGate(None, 0.0, 1e9)
    assert free.allow(("x",)) and free.left() is None
    free.ran(("x",), 0.25)
    assert free.decision()["action"] == "ran" and free.decision()["cost"] == 0.25
    assert FixGate(1.0, 0.0, 0.0).decision() is None


def test_a_decision_kept_from_elsewhere_is_checked_and_written_like_the_budgets_own():
    from mpwatch.record.runtime.budget import CostBudget

    b = CostBudget(0.05)
    b.record("fix_checks", 12, "skipped", 3.0, 0.5, reason="why", detail={"ran_seconds": 1.0})
    (d,) = b.payload()["decisions"]
    assert d == {"step": 12, "part": "fix_checks", "action": "skipped", "estimate_s": 3.0,
                 "allowance_s": 0.5, "cost_s": None, "reason": "why",
                 "detail": {"ran_seconds": 1.0}}  # fmt: skip
    with pytest.raises(ValueError, match="budget action"):
        b.record("fix_checks", 12, "maybe", 1.0, 1.0)


def _near_model():
    """A Dense whose float16 outputs reach 20,000 (32 inputs of 25 times weights of 25), within
    2^3 of float16's maximum, feeding a float32 output of zero weights: a healthy training
    (zero loss and gradients), whose probe checks fixes."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((32,)),
        keras.layers.Dense(16, kernel_initializer=keras.initializers.Constant(25.0),
                           name="hot"),
        keras.layers.Dense(1, dtype="float32", kernel_initializer="zeros", name="out"),
    ])  # fmt: skip
    model.compile(keras.optimizers.SGD(1e-3), "mse")
    return model


X = np.full((8, 32), 25.0, np.float32)
Y = np.zeros((8, 1), np.float32)


def test_the_checks_stop_at_the_first_pass_that_does_not_fit_and_say_so(mixed16):
    from mpwatch.record.probe.probe import Probe

    probe = Probe(_near_model())
    full = probe.run((X, Y), scale=1.0)["fix_checks"]
    assert [c["fix"] for c in full] == ["none", "float32_layers", "normalize_inputs"]
    # the pass as it is was measured cheap; any other program is dearer than what is left
    known = {("float32",): 0.0, ("other",): 1e9}
    probe.fix_gate = gate = FixGate(5.0, 0.0, 0.0, known=known, clock=lambda: 0.0)
    checks = probe.run((X, Y), scale=1.0)["fix_checks"]
    assert checks[0] == full[0]  # the same pass, the same result
    assert [c["fix"] for c in checks] == ["none", "stopped"]
    assert checks[1]["reason"].startswith("mpwatch's cost budget: the next pass was estimated")
    assert gate.decision()["action"] == "skipped"
    # refused at the first pass: wanted, and not run (never "nothing to fix", which is [])
    probe.fix_gate = gate = FixGate(0.0, 0.0, 1.0, clock=lambda: 0.0)
    checks = probe.run((X, Y), scale=1.0)["fix_checks"]
    assert checks == [{"fix": "stopped", "layers": [], "reason": gate.reason()}]
    assert "1.00 s, 0.00 s of the budget left" in gate.reason()


def test_gradient_checks_not_reached_are_marked_skipped(mixed16):
    from mpwatch.record.probe import fix_check
    from mpwatch.record.probe.probe import Probe

    probe = Probe(_near_model())
    probe.run((X, Y), scale=1.0)
    probe.fix_gate = FixGate(0.0, 0.0, 1.0, clock=lambda: 0.0)  # not even the reference fits
    checks = fix_check.check_gradient_fixes(probe, X, Y, None, 1.0, {"hot": 0.5, "out": 1e-3})
    assert checks == [{"layer": "hot", "before": 0.5, "after": None,
                       "skipped": probe.fix_gate.reason()}]  # fmt: skip


def _fit(logdir, budget):
    import mpwatch

    model = _near_model()
    mon = mpwatch.MixedPrecisionMonitor(str(logdir), log_every=4, budget=budget, profile=False)
    model.fit(np.tile(X, (3, 1)), np.tile(Y, (3, 1)), batch_size=8, epochs=1, verbose=0,
              callbacks=[mon])  # fmt: skip
    return model, mon


def test_a_probe_that_fits_with_fix_checks_that_do_not_is_recorded_and_said(
    tmp_path, mixed16, monkeypatch, read_events
):
    """The probe's own estimate is its passes (its trace factor 0), which a 50% budget lets
    run; the fix checks' first pass is estimated far beyond it: the probe runs, its checks do
    not, and the budget record, the probe record and the diagnosis say so."""
    import mpwatch
    from mpwatch import contract
    from mpwatch.record.probe import fix_gate
    from mpwatch.record.runtime import budget as budget_mod

    monkeypatch.setattr(budget_mod, "PROBE_TRACE_FACTOR", 0.0)
    monkeypatch.setattr(fix_gate, "EAGER_PASS_STEPS", 1e9)
    model, _ = _fit(tmp_path / "cut", 0.5)
    _, records = read_events(str(tmp_path / "cut"))
    ((_, b),) = records[contract.KIND_BUDGET]
    parts = [(d["part"], d["action"]) for d in b["decisions"]]
    assert parts == [("probe", "ran"), ("fix_checks", "skipped")]
    ((_, probe),) = records[contract.KIND_PROBE]
    assert [c["fix"] for c in probe["fix_checks"]] == ["stopped"]
    assert probe["model"]["activation_headroom_bits"] < 3
    findings = mpwatch.diagnose(str(tmp_path / "cut"))
    (said,) = [f for f in findings if f.rule == "budget"]
    assert said.data["part"] == "fix_checks"
    assert not any("checked on step" in f.evidence for f in findings)
    # training is the same as without mpwatch: the checks never touch the model
    plain = _near_model()
    plain.fit(np.tile(X, (3, 1)), np.tile(Y, (3, 1)), batch_size=8, epochs=1, verbose=0)
    for a, p in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, p)
    # no budget: every pass runs, and its cost is kept
    _, mon = _fit(tmp_path / "free", None)
    (fix,) = [d for d in mon.budget.decisions if d.part == "fix_checks"]
    assert fix.action == "ran" and fix.cost_s > 0
