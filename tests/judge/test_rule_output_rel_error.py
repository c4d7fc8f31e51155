"""Rule ``output-rel-error`` (mpwatch/judge/rules/output_rel_error.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, layer_rows, make_run, model_row, probe_layer

from mpwatch.judge import diagnose

RULE = "output-rel-error"


def three_layers():
    """dense over float16's threshold; layer_norm far over it, but it computes in float32 inside;
    conv2d under it."""
    layers = [
        probe_layer("dense", rel=0.02),
        probe_layer("layer_norm", rel=0.9),
        probe_layer("conv2d", rel=0.001),
    ]
    return make_run(probes={10: (model_row(), layers)})


CASES = [
    pytest.param(
        three_layers(),
        [{"layer": "dense", "severity": "warning", "action": {"dtype": "float32"}}],
        id="above-threshold-not-float32-inside",
    ),
    pytest.param(
        make_run(
            policy="mixed_bfloat16",
            probes={10: (model_row(mode="bfloat16"), [probe_layer("dense", rel=0.03)])},
        ),
        [],
        id="bfloat16-threshold-is-looser",
    ),
]


def _chain(*errs, output16=False):
    """Dense layers d0, d1, ... in a row (forward order) with these output errors, then a float32
    (or, with ``output16``, a float16) output layer 'probs' without a measured error."""
    out = "float16" if output16 else "float32"
    rows = [
        [
            f"d{i}",
            f"m/d{i}",
            "Dense",
            1,
            "mixed_float16",
            "float16",
            "float32",
            "float16",
            "float16",
            10,
            10,
            {},
            None,
            False,
            None,
        ]
        for i in range(len(errs))
    ]
    rows.append(["probs", "m/probs", "Dense", 1, "mixed_float16", out, "float32", out, out, 10,
                 10, {}, None, True, None])  # fmt: skip
    probe = [probe_layer(f"d{i}", rel=e) for i, e in enumerate(errs)]
    return make_run(layers=rows, probes={10: (model_row(), probe)})


CASES += [
    pytest.param(
        # the transformer of issue 17: the embedding's error carried into every later layer
        _chain(0.867, 0.772, 0.201, 0.201, 0.209, 0.209, 0.104),
        [
            {
                "layer": "d0",
                "data": {"downstream": ["d1", "d2", "d3", "d4", "d5", "d6"]},
                "evidence_has": "carries on into 'd1', 'd2', 'd3', 'd4' and 2 more (up to 77.2%)",
            }
        ],
        id="an-error-carried-forward-is-one-finding-at-its-first-layer",
    ),
    pytest.param(
        _chain(0.02, 0.001, 0.03),
        [{"layer": "d0"}, {"layer": "d2"}],
        id="two-separate-runs-two-findings",
    ),
    pytest.param(
        _chain(0.02, 0.025, 0.5),
        [{"layer": "d0", "data": {"downstream": ["d1"]}}, {"layer": "d2"}],
        id="growing-the-error-2x-again-is-a-cause-of-its-own",
    ),
    pytest.param(
        # MobileNetV2 under mixed_float16 (a real run's probe): the error builds up over dozens
        # of layers, crossing 1% with no layer growing it 2x: no layer to blame
        _chain(0.006, 0.0072, 0.0085, 0.0097, 0.0114, 0.0121, 0.0133, 0.0159, 0.0165, 0.0133),
        [],
        id="an-error-built-up-slowly-has-no-cause",
    ),
    pytest.param(
        make_run(probes={10: (model_row(), [probe_layer("predictions", rel=0.3)])}),
        [],
        id="a-16bit-model-output-is-output-16bits",
    ),
    pytest.param(
        make_run(
            probes={
                10: (
                    model_row(first="conv2d"),
                    [probe_layer("conv2d", rel=0.5, mx=float("inf")), probe_layer("dense", 0, 0.4)],
                )
            }
        ),
        [],
        id="errors-after-a-non-finite-layer-are-activation-overflows",
    ),
]


def test_a_16bit_output_has_one_finding_output_16bit():
    found = diagnose(make_run(probes={10: (model_row(), [probe_layer("predictions", rel=0.3)])}))
    assert [f.rule for f in found if f.layer == "predictions"] == ["output-16bit"]
    assert layer_rows()[3][0] == "predictions"


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_output_rel_error(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
