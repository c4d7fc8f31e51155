"""Rule ``gradient-error`` (mpwatch/judge/rules/gradient_error.py) on constructed Runs: the probe's
per-layer gradient relative error, one finding per contiguous run of erring layers, and none where
another rule names the cause."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import assert_findings, findings_of, make_run, model_row

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "gradient-error"


def grad_row(name, grad_err, uf=0.0, out_err=1e-4, act_uf=0.0, mx=10.0):
    """One probe layers-table row: gradient error, underflow, output error, act-grad underflow."""
    head = math.log2(65504 / mx) if math.isfinite(mx) else -math.inf
    return [name, 1000, int(uf * 1000), uf, grad_err, out_err, mx, head, act_uf, 0]


def _layers(*names, cls="Dense", policy="mixed_float16", compute="float16"):
    """The layers, then a float32 output layer 'probs' (so none of them is the model's output)."""
    return [
        [n, f"m/{n}", cls, 1, policy, compute, "float32", compute, compute, 100, 100, {},
         None, False, None]
        for n in names
    ] + [["probs", "m/probs", "Activation", 1, "float32", "float32", "float32", "float32",
          "float32", 0, 0, {}, None, True, None]]  # fmt: skip


def _run(rows, mode="float16", layers=None):
    names = [r[0] for r in rows]
    policy = "mixed_bfloat16" if mode == "bfloat16" else "mixed_float16"
    lay = layers if layers is not None else _layers(*names, compute=policy[6:], policy=policy)
    return make_run(policy=policy, layers=lay, probes={30: (model_row(mode=mode), rows)})


def measured_rel_error(seed=0, n=4096, noise=0.14):
    """||mixed - reference|| / ||reference|| of a gradient with ``noise`` relative noise, computed
    here with numpy: the ground truth a probe row would carry."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=n)
    mixed = ref + noise * np.linalg.norm(ref) / math.sqrt(n) * rng.normal(size=n)
    return float(np.linalg.norm(mixed - ref) / np.linalg.norm(ref))


E14 = measured_rel_error()  # about 0.14, as the first layer of issue 17
# four layers with a float16 gradient error of a few units of rounding (0.2%)
HEALTHY = [grad_row(f"h{i}", 0.002) for i in range(4)]
# MobileNetV2 under mixed_float16 (keras.applications, 32x32, a real run's probe at step 30):
# every layer's gradient is 16-40% off float32, none stands out, and the network trains well
MOBILENET_LIKE = [
    grad_row(f"m{i}", e)
    for i, e in enumerate([0.319, 0.262, 0.298, 0.211, 0.162, 0.202, 0.166, 0.170, 0.182, 0.404])
]


CASES = [
    pytest.param(
        _run([grad_row("embed", E14), grad_row("dense", 0.002), grad_row("out", 0.001)]),
        [
            {
                "severity": "warning",
                "layer": "embed",
                "action": {"dtype": "float32"},
                "title_has": f"{100 * E14:.1f}%",
                "fix_has": 'keras.layers.Dense(..., dtype="float32", name="embed")',
                "data": {"layers": ["embed"]},
            }
        ],
        id="a-14pct-gradient-error-in-the-first-layer",
    ),
    pytest.param(
        _run(
            [
                grad_row("a", 0.14),
                ["act", None, None, None, None, 1e-4, 1.0, 16.0, 0.0, 0],
                grad_row("b", 0.08),
                grad_row("c", 0.06),
                *HEALTHY,
            ]
        ),
        [
            {
                "layer": "c",
                "evidence_has": ("'a', 'b'", "14.0%"),
                "data": {"layers": ["a", "b", "c"]},
            }
        ],
        id="a-contiguous-run-is-one-finding-where-the-error-enters-backprop",
    ),  # fmt: skip
    pytest.param(
        _run([grad_row("a", 0.14), grad_row("b", 0.01), grad_row("c", 0.09), *HEALTHY]),
        [{"layer": "a"}, {"layer": "c"}],
        id="two-separate-runs-two-findings",
    ),
    pytest.param(_run(MOBILENET_LIKE), [], id="an-error-every-layer-shares-is-no-layers-fault"),
    pytest.param(
        _run([grad_row("a", 0.9, uf=0.3), grad_row("b", 0.2, uf=0.0)]),
        [],
        id="underflow-in-the-run-is-gradient-underflows",
    ),
    pytest.param(
        _run([grad_row("a", 0.2, act_uf=0.05), grad_row("b", 0.01)]),
        [],
        id="output-gradient-underflow-is-gradient-underflows",
    ),
    pytest.param(
        _run([grad_row("a", 0.01, out_err=0.5), grad_row("b", 0.3)]),
        [],
        id="a-forward-error-before-it-is-output-rel-errors",
    ),
    pytest.param(
        _run([grad_row("a", 0.6)]),
        [{"severity": "error", "layer": "a"}],
        id="above-half-is-an-error",
    ),
    pytest.param(
        _run([grad_row("a", 0.03)], mode="bfloat16"),
        [],
        id="bfloat16-3pct-is-typical",
    ),
    pytest.param(
        _run([grad_row("a", 0.12)], mode="bfloat16"),
        [{"severity": "warning", "layer": "a"}],
        id="bfloat16-12pct-is-flagged",
    ),
    pytest.param(
        _run([grad_row("a", 0.2)], layers=_layers("a", policy="float32", compute="float32")),
        [{"layer": "a", "action": {}, "fix_has": "already compute in float32"}],
        id="a-float32-layer-gets-no-float32-advice",
    ),
    pytest.param(
        # MobileNetV3Small under mixed_float16 (keras.applications, a real run's probe): a 16-bit
        # convolution then its float32 BatchNormalization with the larger error: the error enters
        # after the convolution, whose float32 fix check had measured it does not help
        _run(
            [*HEALTHY, grad_row("expand", 0.0519), grad_row("expand_bn", 0.0748),
             grad_row("t0", 0.002), grad_row("t1", 0.002)],
            layers=[*_layers("h0", "h1", "h2", "h3", "expand")[:-1],
                    *_layers("expand_bn", policy="float32", compute="float32")[:-1],
                    *_layers("t0", "t1")],
        ),  # fmt: skip
        [{"layer": "expand", "action": {}, "fix_has": "would not remove it"}],
        id="a-larger-error-in-the-float32-layer-after-it-gets-no-float32-advice",
    ),
    pytest.param(
        make_run(
            probes={30: (model_row(mode="preflight"), [grad_row("dense", 0.3)])}, policy="float32"
        ),  # fmt: skip
        [],
        id="pre-flight-not-judged",
    ),
    pytest.param(
        make_run(
            probes={30: (model_row(first="dense"), [grad_row("dense", 0.3, mx=float("inf"))])}
        ),
        [],
        id="a-non-finite-forward-pass-is-activation-overflows",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_gradient_error(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_the_ground_truth_error_is_about_14pct():
    assert 0.12 < E14 < 0.16


def _container_run(check=None):
    """'blk' holds two layers of its own (paths under m/blk), as the keras.io Transformer's
    TransformerBlock holds its MultiHeadAttention and Dense layers."""
    lay = _layers("embed", "blk", "out")
    subs = [[n, f"m/blk/{n}", "Dense", 2, "mixed_float16", "float16", "float32", "float16",
             "float16", 100, 100, {}, None, False, None] for n in ("ffn_1", "ffn_2")]  # fmt: skip
    lay = lay[:2] + subs + lay[2:]
    for row in lay:
        if row[0] == "blk":
            row[2] = "TransformerBlock"
    run = _run([grad_row("embed", 0.002), grad_row("blk", E14), grad_row("out", 0.001)],
               layers=lay)  # fmt: skip
    if check is not None:
        run.records[contract.KIND_PROBE] = [(30, {"grad_fix_checks": [check]})]
    return run


def test_a_container_is_kept_in_float32_whole_in_the_code():
    (f,) = findings_of(diagnose(_container_run()), RULE)
    assert f.layer == "blk"
    # dtype="float32" on the container alone leaves 'ffn_1' and 'ffn_2' in float16 (Keras gives
    # a layer's dtype to none of the layers it creates): the code switches all of it
    assert 'dtype="float32", name="blk"' not in f.fix
    assert 'for sub in model.get_layer("blk")._flatten_layers():' in f.fix
    assert "'ffn_1', 'ffn_2'" in f.fix
    assert 'set_global_policy("mixed_float16")' in f.fix


def test_a_fix_check_that_could_not_run_is_said_not_checked():
    check = {"layer": "blk", "before": E14, "after": None,
             "error": "InvalidArgumentError: cannot compute AddV2"}  # fmt: skip
    (f,) = findings_of(diagnose(_container_run(check)), RULE)
    assert "could not run the pass with 'blk' in float32" in f.evidence
    assert "this fix is not checked" in f.evidence
    assert f.action == {"dtype": "float32"}  # the finding stands; its fix is marked unchecked


@pytest.mark.parametrize(("after", "fixed"), [(0.08, True), (0.2, False)])
def test_a_bfloat16_fix_is_checked_against_bfloat16s_threshold(after, fixed):
    """In bfloat16 the rule's threshold is 10%: float32 there fixes a 30% error that falls to 8%
    (below 10% and under half of what it was), and does not fix one that stays at 20%."""
    run = _run([grad_row("a", 0.3), *HEALTHY], mode="bfloat16")
    check = {"layer": "a", "before": 0.3, "after": after}
    run.records[contract.KIND_PROBE] = [(30, {"mode": "bfloat16", "grad_fix_checks": [check]})]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["checked_fixed"] is fixed
    assert (f.action == {"dtype": "float32"}) is fixed
