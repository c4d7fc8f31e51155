"""When the JAX tap's counting program (``mpwatch.record.tap.jax_programs``) starts compiling: by
the fit's cost budget, on a budget driven by explicit clock values (the decision is arithmetic on
the fit's first step, its steady step time and its length). The programs themselves are tested on
Keras' JAX backend in tests/record/test_jax_backend.py."""

from __future__ import annotations

import pytest

from mpwatch.record.runtime.budget import CostBudget
from mpwatch.record.tap.jax_programs import COMPILE_MARGIN, compile_now


def _fit(total_steps, calls, first=10.0, step=0.1, fraction=0.05):
    """A budget after ``calls`` Keras calls of one step: the first took ``first`` seconds (the
    step's trace and compile), the others ``step`` each; the clock after the last call."""
    params = {"epochs": 1, "steps": total_steps} if total_steps else {}
    b = CostBudget(fraction)
    b.begin_fit(params, now=0.0)
    now = first
    b.batch_end(1, now=now)
    for _ in range(calls - 1):
        now += step
        b.batch_end(1, now=now)
    return b, now


def test_no_budget_compiles_at_once():
    assert compile_now(None) == (True, "")
    b, _ = _fit(10, 1, fraction=None)  # budget=None: everything as before the budget
    assert compile_now(b) == (True, "")


def test_waits_for_the_step_time():
    b, _ = _fit(1000, 1)
    go, why = compile_now(b)
    assert not go and "step time" in why


@pytest.mark.parametrize("total, go", [(1000, True), (100, False)])
def test_a_fit_of_known_length_compiles_when_what_is_left_is_long_enough(total, go, monkeypatch):
    """First step 10 s, then 0.1 s a step: after 3 steps, 1,000 steps leave 99.7 s (over 2x the
    estimated 10 s compile), 100 steps 9.7 s (under it)."""
    b, now = _fit(total, 3)
    monkeypatch.setattr("time.perf_counter", lambda: now)
    left = (total - 3) * 0.1
    assert (left >= COMPILE_MARGIN * 10.0) is go
    got, why = compile_now(b)
    assert got is go
    if not go:
        assert "too short" in why and f"{now - 10.0:.2f} s after its first step" in why
        assert "estimated compile (10.0 s" in why


def test_a_fit_of_unknown_length_counts_the_time_so_far(monkeypatch):
    b, now = _fit(None, 3)  # 10.2 s so far: under 2x 10 s
    monkeypatch.setattr("time.perf_counter", lambda: now)
    go, why = compile_now(b)
    assert not go and "0.20 s after its first step" in why
    monkeypatch.setattr("time.perf_counter", lambda: 20.5)
    assert compile_now(b) == (True, "")


def test_a_later_fit_estimates_by_the_models_first_trace(monkeypatch):
    """A later fit reuses the every-step program (its first step is fast); the counting program
    not compiled yet is estimated by the model's first monitored fit's first step."""
    b, now = _fit(1000, 3, first=0.1)  # 99.7 s left
    monkeypatch.setattr("time.perf_counter", lambda: now)
    assert compile_now(b)[0]
    b.trace_seconds = 60.0
    go, why = compile_now(b)
    assert not go and "60.0 s" in why
