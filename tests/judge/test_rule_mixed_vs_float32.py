"""Rule ``mixed-vs-float32`` (mpwatch/judge/rules/mixed_vs_float32.py): a mixed run against a
float32 run of the same model, paired by diagnose_runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, layer_rows, make_run, perf_scalars, run_info

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

# the same parameter count (run_info) as F32, but another structure: a different model
SAME_COUNT_OTHER_LAYERS = make_run(
    "fp32",
    policy="float32",
    layers=[r[:2] + ["Conv1D"] + r[3:] if r[0] == "conv2d" else r for r in layer_rows("float32")],
    scalars=perf_scalars(25.0, 1.0, 800.0),
)
# the same structure, the model and its layers named otherwise (Keras numbers names per session)
RENAMED = make_run(
    "fp32",
    policy="float32",
    layers=[[r[0] + "_1", r[1] + "_1", *r[2:]] for r in layer_rows("float32")],
    scalars=perf_scalars(25.0, 1.02, 800.0),
    info={**run_info("float32"), "model": {**run_info("float32")["model"], "name": "cnn_1"}},
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
        [{"severity": "warning", "title_has": ("no speed-up, 1.2x slower", "losses differ")}],
        id="slower-and-losses-differ-is-a-warning",
    ),
    pytest.param([MIXED, OTHER_MODEL], [], id="a-different-model-is-not-compared"),
    pytest.param(
        [MIXED, SAME_COUNT_OTHER_LAYERS], [], id="the-same-parameter-count-alone-is-not-enough"
    ),
    pytest.param(
        [MIXED, RENAMED],
        [{"severity": "info", "data": {"float32_run": "fp32"}}],
        id="same-structure-other-names-is-compared",
    ),
]


@pytest.mark.parametrize(("runs", "expected"), CASES)
def test_mixed_vs_float32(runs, expected):
    assert_findings(findings_of(diagnose_runs(runs), RULE), expected)


def test_compare_runs_is_the_rules_check_pair():
    a = compare_runs(MIXED, F32)
    b = mixed_vs_float32.check_pair(MIXED, F32)
    assert [f.to_dict() for f in a] == [f.to_dict() for f in b] and len(a) == 1
