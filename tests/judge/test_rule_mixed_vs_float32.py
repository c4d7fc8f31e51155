"""Rule ``mixed-vs-float32`` (mpwatch/judge/rules/mixed_vs_float32.py): a mixed run against a
float32 run of the same model, paired by diagnose_runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, perf_scalars, run_info

from mpwatch.judge import compare_runs, diagnose_runs
from mpwatch.judge.rules import mixed_vs_float32

RULE = "mixed-vs-float32"

MIXED = make_run("mixed", scalars=perf_scalars(10.0, 1.0, 400.0))
F32 = make_run("fp32", policy="float32", scalars=perf_scalars(25.0, 1.02, 800.0))
SLOW = make_run("mixed", scalars=perf_scalars(30.0, 2.0, 400.0))
OTHER_MODEL = make_run(
    "fp32",
    policy="float32",
    scalars=perf_scalars(25.0, 1.0, 800.0),
    info={**run_info("float32"), "model": {"name": "x", "params": 1}},
)

CASES = [
    pytest.param(
        [MIXED, F32],
        [
            {
                "severity": "info",
                "run": "mixed",
                "data": {
                    "step_time_ratio": pytest.approx(0.4),
                    "memory_ratio": pytest.approx(0.5),
                    "losses_agree": True,
                },
            }
        ],
        id="faster-same-loss-is-info",
    ),
    pytest.param(
        [SLOW, F32],
        [{"severity": "warning", "title_has": ("no speed-up", "losses differ")}],
        id="slower-and-losses-differ-is-a-warning",
    ),
    pytest.param([MIXED, OTHER_MODEL], [], id="a-different-model-is-not-compared"),
]


@pytest.mark.parametrize(("runs", "expected"), CASES)
def test_mixed_vs_float32(runs, expected):
    assert_findings(findings_of(diagnose_runs(runs), RULE), expected)


def test_compare_runs_is_the_rules_check_pair():
    a = compare_runs(MIXED, F32)
    b = mixed_vs_float32.check_pair(MIXED, F32)
    assert [f.to_dict() for f in a] == [f.to_dict() for f in b] and len(a) == 1
