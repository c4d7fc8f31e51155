"""Rule ``activation-overflow`` (mpwatch/judge/rules/activation_overflow.py) on constructed Runs:
one finding per cause (the first layer out of float16's range), predictions on pre-flight probes."""

from __future__ import annotations

import math

import pytest
from builders import assert_findings, findings_of, layer_rows, make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "activation-overflow"
INF = float("inf")
NAN = float("nan")
KERAS = "keras.src.layers.core.dense"


def _probed(mx, nonfinite=False, **model):
    probes = {10: (model_row(mx=mx, **model), [probe_layer("dense", mx=mx, nonfinite=nonfinite)])}
    return make_run(probes=probes)


def _row(name, cls, compute="float16", output=None, is_output=False, policy="mixed_float16"):
    """A layer-table row of a Sequential model named 'net'."""
    out = output or compute
    return [name, f"net/{name}", cls, 1, policy, compute, "float32", out, compute, 10, 10, {},
            None, is_output, None]  # fmt: skip


def logsumexp_run():
    """The LogSumExpPool model of issue 17 (Dense 'proj' -> Reshape -> LogSumExpPool -> Dense ->
    Dense -> float32 softmax 'output'), with the probe a real run recorded at step 30: the pool's
    exp overflows float16 (inf), every layer after it is non-finite, the loss is NaN, so 'proj''s
    gradients are NaN too."""
    layers = [
        _row("proj", "Dense"),
        _row("reshape", "Reshape"),
        _row("logsumexp_pool", "LogSumExpPool"),
        _row("dense", "Dense"),
        _row("dense_1", "Dense"),
        _row("output", "Dense", "float32", is_output=True, policy="float32"),
    ]
    probe = [
        ["proj", 4224, 0, 0.0, NAN, 3.5e-4, 21.64, math.log2(65504 / 21.64), 0.03, 4224],
        ["reshape", None, None, None, None, 3.5e-4, 21.64, math.log2(65504 / 21.64), 0.03, 0],
        ["logsumexp_pool", None, None, None, None, INF, INF, -INF, 0.008, 141],
        ["dense", 340, 0, 0.0, NAN, NAN, INF, -INF, 0.003, 1352],
        ["dense_1", 272, 0, 0.0, NAN, NAN, INF, -INF, 0.004, 1024],
        ["output", 150, 0, 0.0, NAN, NAN, INF, -INF, 0.0, 480],
    ]
    model = model_row(mx=INF, first="logsumexp_pool")
    model.update(loss=NAN, ref_loss=6.17, grad_rel_error=NAN)
    run = make_run(layers=layers, probes={30: (model, probe)})
    run.info["model"] = {"name": "net", "class": "Sequential", "kind": "sequential", "params": 60}
    modules = {"Dense": KERAS, "Reshape": "keras.src.layers.reshaping.reshape",
               "LogSumExpPool": "__main__"}  # fmt: skip
    run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": modules})]
    return run


def _preflight(mx):
    layers = [probe_layer("conv2d", mx=10.0), probe_layer("dense", mx=mx)]
    probes = {5: (model_row(mode="preflight", mx=mx), layers)}
    return make_run(policy="float32", probes=probes)


def _warning_before_and_after_the_root():
    """conv2d near 65504 before the root 'dense' (a real warning); layer_norm after it near too
    (its numbers rest on the root's output: not judged)."""
    layers = [
        probe_layer("conv2d", mx=65504 / 4),
        probe_layer("dense", mx=INF, nonfinite=True),
        probe_layer("layer_norm", mx=65504 / 4),
    ]
    return make_run(probes={10: (model_row(mx=INF, first="dense"), layers)})


def _root_already_float32():
    rows = layer_rows("mixed_float16")
    rows[1][4:6] = ["float32", "float32"]  # 'dense' under dtype="float32"
    rows[1][7:9] = ["float32", "float32"]
    layers = [probe_layer("dense", mx=INF, nonfinite=True)]
    return make_run(layers=rows, probes={10: (model_row(mx=INF, first="dense"), layers)})


CASES = [
    pytest.param(
        _probed(65504 * 2),
        [{"severity": "error", "layer": "dense", "data": {"max_abs_activation": 65504 * 2}}],
        id="above-65504-is-an-error",
    ),
    pytest.param(
        _probed(INF, nonfinite=True),
        [{"severity": "error", "layer": "dense"}],
        id="non-finite-is-an-error",
    ),
    pytest.param(
        _probed(65504 / 4),
        [{"severity": "warning", "layer": "dense", "data": {"max_abs_activation": 65504 / 4}}],
        id="within-3-doublings-is-a-warning",
    ),
    pytest.param(_probed(65504 / 16), [], id="4-doublings-of-headroom-is-fine"),
    pytest.param(
        make_run(probes={10: (model_row(first="dense"), [probe_layer("dense", mx=INF)])}),
        [{"severity": "error", "layer": "dense", "title_has": "first appear in layer 'dense'"}],
        id="first-nonfinite-layer-named-once",
    ),
    pytest.param(_probed(1e6, mode="bfloat16"), [], id="bfloat16-probe-not-checked-against-65504"),
    pytest.param(
        logsumexp_run(),
        [
            {
                "severity": "error",
                "layer": "logsumexp_pool",
                "action": {"dtype": "float32"},
                "title_has": "LogSumExpPool",
                "evidence_has": ("'dense', 'dense_1', 'output'", "'proj'", "loss non-finite"),
                "fix_has": 'LogSumExpPool(..., dtype="float32", name="logsumexp_pool")',
                "data": {"downstream": ["dense", "dense_1", "output"]},
            }
        ],
        id="a-cascade-is-one-error-at-its-first-layer",
    ),
    pytest.param(
        _preflight(1e6),
        [
            {
                "severity": "info",
                "layer": "dense",
                # the printed "when you switch" advice, applied with the switch (moot under
                # float32: apply_recommendations leaves float32 layers of a float32 model alone)
                "action": {"dtype": "float32"},
                "title_has": "Under mixed_float16",
                "fix_has": "when you switch to mixed_float16",
            }
        ],
        id="pre-flight-is-a-prediction-not-an-error",
    ),
    pytest.param(
        _preflight(65504 / 4),
        [{"severity": "info", "layer": "dense", "action": {"dtype": "float32"},
          "title_has": "would come within"}],  # fmt: skip
        id="pre-flight-near-overflow-is-info",
    ),
    pytest.param(
        _warning_before_and_after_the_root(),
        [
            {"severity": "error", "layer": "dense"},
            {"severity": "warning", "layer": "conv2d"},
        ],
        id="a-warning-before-the-root-stays-one-after-it-goes",
    ),
    pytest.param(
        _root_already_float32(),
        [{"severity": "error", "layer": "dense", "action": {}, "fix_has": "already computes"}],
        id="no-keep-float32-for-a-float32-layer",
    ),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_activation_overflow(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_the_overflowing_custom_layer_is_the_only_error_of_the_layer_rules():
    """Issue 17: one LogSumExpPool that overflows float16 gave four errors (the layer, two layers
    downstream, and the float32 output told to keep float32). Exactly one now, at the layer, and
    the fix names the user's class by its own name."""
    found = diagnose(logsumexp_run())
    layer_rules = {"activation-overflow", "output-rel-error", "gradient-error", "output-16bit"}
    mine = [f for f in found if f.rule in layer_rules]
    assert [(f.rule, f.severity, f.layer) for f in mine] == [
        ("activation-overflow", "error", "logsumexp_pool")
    ]
    assert "keras.layers.LogSumExpPool" not in mine[0].fix
    assert not [f for f in found if f.layer == "output" and f.action.get("dtype") == "float32"]


def _skipping(run, steps=30):
    """The run's training as recorded: every step skipped, the scale halved from 2^15 each time."""
    scale = {s: 2.0 ** (15 - s) for s in range(1, steps + 1)}
    run.scalars = make_run(
        scalars={contract.LOSS_SCALE: scale, contract.STEP_SKIPPED: dict.fromkeys(scale, 1.0)}
    ).scalars
    return run


def test_an_overflowing_custom_layer_is_exactly_one_error():
    """Issue 17's acceptance: an overflowing custom layer gives exactly one error, at that layer.
    The skipped steps and the scale driven down follow from it (the activation overflows whatever
    the scale) and are its evidence."""
    found = diagnose(_skipping(logsumexp_run()))
    errors = [(f.rule, f.layer) for f in found if f.severity == "error"]
    assert errors == [("activation-overflow", "logsumexp_pool")]
    (root,) = [f for f in found if f.rule == RULE]
    assert root.data["forward"] is True
    assert not [f for f in found if f.rule in ("skipped-steps", "loss-scale")]
    assert "skipped-steps" in root.data.get("also", []) or "skipped" in root.evidence


def test_a_gradient_overflow_leaves_the_loss_scale_findings_alone():
    """The first non-finite layer found in the backward pass (its activation finite): a scale
    matter, so the skipped-steps finding stays a finding of its own."""
    layers = [probe_layer("conv2d", mx=10.0), probe_layer("dense", mx=30.0, nonfinite=True)]
    run = _skipping(make_run(probes={30: (model_row(mx=30.0, first="dense"), layers)}))
    found = diagnose(run)
    (root,) = findings_of(found, RULE)
    assert root.data["forward"] is False and "also" not in root.data
    assert findings_of(found, "skipped-steps")


def test_a_float16_softmax_whose_gradient_overflows_at_any_scale_is_one_error():
    """ResNet50 of issue 17 (a real run's probe at step 30): its float16 softmax 'predictions'
    gives finite outputs (max 1) but non-finite gradients even at loss scale 0.5, so steps are
    skipped and the scale is driven below 1. One cause, one error: output-16bit's, at
    'predictions', the overflow and the skips as its evidence."""
    layers = [probe_layer("conv2d", mx=8.7), probe_layer("predictions", mx=1.0, nonfinite=True)]
    model = model_row(mx=8.7, first="predictions", scale=0.5)
    found = diagnose(_skipping(make_run(probes={30: (model, layers)})))
    errors = [(f.rule, f.layer) for f in found if f.severity == "error"]
    assert errors == [("output-16bit", "predictions")]
    (f,) = [f for f in found if f.severity == "error"]
    assert {"activation-overflow", "skipped-steps"} <= set(f.data["also"])
    assert "first appear in the gradients of layer 'predictions' (Dense)" in f.evidence
    assert not findings_of(found, RULE) and not findings_of(found, "skipped-steps")
