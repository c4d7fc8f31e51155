"""A step's accounting under gradient accumulation, on both backends, against the optimizer's own
counter (issue 50, "one step accounting").

tests/record/accumulation_fit.py trains a Dense network under mixed_float16 with
``Adam(gradient_accumulation_steps=4)``, 24 batches, four of which overflow float16 (the
LossScaleOptimizer skips exactly those), beside an observer reading the optimizer's raw step
counter after every batch (it advances on every batch taken, applied or accumulated: a skip is
a batch where it did not). Keras' public ``iterations`` is that counter // 4, which the taps once
read as "skipped" on three batches in four. The event files are parsed by conftest's
independent parser.
"""

from __future__ import annotations

import pytest

import mpwatch
from mpwatch import contract

BATCHES = 24
OVERFLOW_BATCHES = {2, 3, 9, 17}  # as in tests/record/accumulation_fit.py (0-based)


@pytest.fixture(scope="module", params=["tensorflow", "jax"])
def runs(request, script_runs):
    return script_runs("record/accumulation_fit.py", backend=request.param)


def _truth_skips(case):
    raw = [0] + case["raw"]
    return [float(raw[i + 1] == raw[i]) for i in range(BATCHES)]


@pytest.mark.parametrize("name", ["accumulate", "accumulate_every5"])
def test_skips_are_the_optimizers_and_accumulated_batches_are_not_skips(runs, read_events, name):
    out, truth = runs
    case = truth[name]
    skipped = _truth_skips(case)
    assert [i for i, s in enumerate(skipped) if s] == sorted(OVERFLOW_BATCHES)
    # the public iterations: the updates applied, one in four of the batches taken
    assert case["iterations"][-1] == case["raw"][-1] // 4 < BATCHES - len(OVERFLOW_BATCHES)
    scalars, _ = read_events(str(out / name))
    assert scalars[contract.STEP_SKIPPED] == [(i + 1, s) for i, s in enumerate(skipped)]
    assert scalars[contract.LOSS_SCALE][1:] == [(i + 1, s) for i, s in enumerate(case["scale"])]
    total = dict(scalars[contract.SKIPPED_STEPS_TOTAL])
    assert total[max(total)] == len(OVERFLOW_BATCHES)


def test_the_diagnosis_counts_the_real_skips_and_advises_no_lower_scale(runs):
    out, _ = runs
    run = mpwatch.load_run(str(out / "accumulate"))
    assert int(run.skipped_steps().sum()) == len(OVERFLOW_BATCHES)
    findings = mpwatch.diagnose(str(out / "accumulate"))
    said = " ".join(f"{f.title} {f.evidence} {f.fix or ''}" for f in findings)
    assert "failed doubling" not in said
    assert "initial_scale" not in said  # four skips in a descent from 2^15: no scale advice
