"""Where a restored training state lies in a run's logs (mpwatch/callbacks/_resume.py).

Logs are written with the contract's writer from a simulated optimizer (iterations advance on an
applied step; a skipped step halves the scale), and the expected step is the simulation's own.
"""

from __future__ import annotations

import pytest

from mpwatch import contract
from mpwatch.record.runtime.resume import ResumePoint, find_resume_point
from mpwatch.record.runtime.writer import RunWriter


def simulate(first_step: int, iterations: int, scale: float, n: int, skips: set[int]):
    """(step, iterations after it, scale after it, skipped) for n batches from first_step."""
    rows = []
    for step in range(first_step, first_step + n):
        skipped = step in skips
        if skipped:
            scale /= 2
        else:
            iterations += 1
        rows.append((step, iterations, scale, skipped))
    return rows


def write_life(logdir: str, anchor_step: int, iterations: int, scale: float, rows) -> None:
    w = RunWriter(logdir)
    w.record(
        contract.KIND_RUN_INFO,
        anchor_step,
        {"policy": "mixed_float16", "start": {"iterations": iterations, "loss_scale": scale}},
    )
    steps = [r[0] for r in rows]
    w.scalar_series(contract.LOSS_SCALE, steps, [r[2] for r in rows])
    w.scalar_series(contract.STEP_SKIPPED, steps, [float(r[3]) for r in rows])
    w.close()


@pytest.fixture(scope="module")
def two_lives(tmp_path_factory):
    """Life 1: steps 1-12 (skips 4, 8); killed. Life 2 restored the state after step 8 and ran
    steps 9-20 (skip 15), rewriting 9-12 with other batches."""
    logdir = str(tmp_path_factory.mktemp("resume"))
    life1 = simulate(1, 0, 32768.0, 12, {4, 8})
    write_life(logdir, 0, 0, 32768.0, life1)
    _, it8, sc8, _ = life1[7]
    life2 = simulate(9, it8, sc8, 12, {15})
    write_life(logdir, 8, it8, sc8, life2)
    return logdir, life1, life2


def test_a_state_of_the_first_life_is_found_at_its_step(two_lives):
    logdir, life1, _ = two_lives
    for step, iterations, scale, _ in life1[:8]:  # 9-12 were rewritten by life 2
        point = find_resume_point(logdir, iterations, scale)
        assert point == ResumePoint(step, sum(1 for s in (4, 8) if s <= step)), step


def test_a_skipped_step_and_the_step_before_it_are_told_apart_by_the_scale(two_lives):
    logdir, life1, _ = two_lives
    (_, it7, sc7, _), (_, it8, sc8, _) = life1[6], life1[7]
    assert it7 == it8 and sc7 != sc8  # iterations alone cannot tell 7 from 8
    assert find_resume_point(logdir, it7, sc7).step == 7
    assert find_resume_point(logdir, it8, sc8).step == 8


def test_a_state_of_the_second_life_counts_the_skips_of_both(two_lives):
    logdir, _, life2 = two_lives
    step, iterations, scale, _ = life2[-3]  # step 18
    assert find_resume_point(logdir, iterations, scale) == ResumePoint(18, 3)


def test_no_match_no_anchor_or_no_logs_give_none(two_lives, tmp_path):
    logdir, _, life2 = two_lives
    _, iterations, scale, _ = life2[-1]
    assert find_resume_point(logdir, iterations + 1, scale) is None  # a state never logged
    assert find_resume_point(logdir, iterations, scale * 4) is None
    assert find_resume_point(logdir, 0, 32768.0) is None  # a fresh optimizer
    assert find_resume_point(str(tmp_path / "empty"), 5, 1.0) is None
    w = RunWriter(str(tmp_path / "old"))  # logs without the run_info anchor
    w.scalar_series(contract.LOSS_SCALE, [1, 2], [2.0, 2.0])
    w.close()
    assert find_resume_point(str(tmp_path / "old"), 2, 2.0) is None
