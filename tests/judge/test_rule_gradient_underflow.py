"""Rule ``gradient-underflow`` (mpwatch/judge/rules/gradient_underflow.py) on constructed Runs.

Underflow figures come from gradient samples chosen here and numpy's float16 (builders.grad_probe);
the bfloat16 cases check that nothing float16-specific is said of a bfloat16 run."""

from __future__ import annotations

import pytest
from builders import (
    assert_findings,
    f16_lost,
    findings_of,
    grad_probe,
    keras_scale_history,
    log_uniform,
    make_run,
    model_row,
    probe_layer,
    probe_records,
    run_info,
    scale_run,
)

from mpwatch import contract
from mpwatch.judge import diagnose
from mpwatch.read import run_from_records

RULE = "gradient-underflow"
MY_RULES = ("gradient-underflow", "loss-scale", "skipped-steps")


def _model_wide(uf):
    return make_run(
        probes={10: (model_row(uf=uf, scale=8.0, rec=2.0**15), [probe_layer("dense", uf=0.0)])}
    )


@pytest.mark.parametrize(
    ("uf", "severity"),
    [(0.005, None), (0.02, "warning"), (0.2, "error")],
    ids=["model-0.5%-is-fine", "model-2%-warning", "model-20%-error"],
)
def test_model_wide_thresholds(uf, severity):
    expected = [] if severity is None else [
        {"severity": severity, "layer": None, "data": {"underflow_fraction": uf}}
    ]  # fmt: skip
    assert_findings(findings_of(diagnose(_model_wide(uf)), RULE), expected)


def test_a_probe_without_sweep_proposes_no_scale():
    # the old rule proposed the probe's recommended scale blindly: without a sweep there is no
    # predicted figure, so there is no proposal
    (f,) = findings_of(diagnose(_model_wide(0.2)), RULE)
    assert "initial_scale" not in f.fix and "loss_scale" not in f.action


def test_underflowing_layers_make_one_finding():
    probes = {
        10: (
            model_row(uf=0.0),
            [probe_layer("dense", uf=0.06), probe_layer("c", uf=0.04), probe_layer("d", uf=0.3)],
        )
    }
    found = findings_of(diagnose(make_run(probes=probes)), RULE)
    assert_findings(
        found,
        [{"severity": "warning", "layer": None, "title_has": "2 layers",
          "evidence_has": ("'d' 30.0%", "'dense' 6.00%")}],
    )  # fmt: skip
    assert found[0].action == {"float32_layers": ["dense", "d"]}  # forward order


def test_one_underflowing_layer_is_named_as_the_findings_layer():
    probes = {10: (model_row(uf=0.0), [probe_layer("dense", uf=0.06), probe_layer("c", uf=0.04)])}
    assert_findings(
        findings_of(diagnose(make_run(probes=probes)), RULE),
        [{"layer": "dense", "severity": "warning"}],
    )


def test_measured_figures_are_numpy_float16():
    g = log_uniform(-45, -13)
    scales, skipped = keras_scale_history(400, lambda s, S: False)
    run = scale_run([grad_probe(400, {"dense": g}, scales[400])], scales, skipped)
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["underflow_fraction"] == f16_lost(g, 2.0**15)
    assert f.severity == "error" and "2^15 (32768)" in f.title


def test_subnormal_share_without_probe_is_info_on_float16():
    run = make_run(scalars={contract.GRAD_SUBNORMAL_FRACTION: {s: 0.2 for s in range(1, 41)}})
    assert_findings(findings_of(diagnose(run), RULE), [{"severity": "info"}])


def _bfloat16_run(probe_uf=0.0):
    """A mixed_bfloat16 run as the recorder writes one: no loss scale, the float16-defined
    subnormal share of its gradients high (it is measured against 2^-14 whatever the policy),
    three bfloat16 probes (no sweep, no loss scale)."""
    records = {
        contract.KIND_RUN_INFO: [(0, run_info("mixed_bfloat16"))],
        contract.KIND_PROBE: probe_records([(100, "bfloat16"), (200, "bfloat16"),
                                            (300, "bfloat16")]),
    }  # fmt: skip
    for _, p in records[contract.KIND_PROBE]:
        p["model"]["underflow_fraction"] = probe_uf
        p["model"]["underflow_count"] = int(probe_uf * p["model"]["ref_nonzero"])
        p["layers"]["data"] = [[r[0], r[1], 0, 0.0, *r[4:]] for r in p["layers"]["data"]]
    steps = list(range(1, 301))
    scalars = {contract.GRAD_SUBNORMAL_FRACTION: (steps, [0.986] * len(steps))}
    return run_from_records("bf16", scalars=scalars, records=records)


def test_no_float16_measure_on_a_bfloat16_run():
    run = _bfloat16_run()
    found = [f for f in diagnose(run) if f.rule in MY_RULES]
    assert found == []


def test_bfloat16_underflow_is_said_in_bfloat16_terms():
    run = _bfloat16_run(probe_uf=0.03)
    found = [f for f in diagnose(run) if f.rule in MY_RULES]
    (f,) = found
    assert f.rule == RULE and "bfloat16" in f.title
    for text in (f.title, f.evidence, f.fix):
        assert "float16" not in text.replace("bfloat16", "")
        assert "loss scale" not in text and "LossScale" not in text


def test_layers_underflowing_at_a_scale_held_down_by_overflows_blame_the_overflow():
    # 13 skips bring 2^15 to 4 (the float16 softmax of ResNet50 at 32x32): layer 'a' loses 10%
    # at 4, model-wide 0.3%; the probe's gradients would allow 2^19 (max 2^-8, 4 doublings spare)
    import numpy as np
    from builders import margin_scale

    scales, skipped = keras_scale_history(30, lambda s, S: s <= 13)
    assert scales[30] == 4.0
    a = np.concatenate([log_uniform(-20, -10, 540), log_uniform(-40, -30, 60, seed=5)])
    b = log_uniform(-20, -8, 20000, seed=6)
    run = scale_run([grad_probe(30, {"a": a, "b": b}, 4.0)], scales, skipped)
    assert f16_lost(a, 4.0) == pytest.approx(0.1) and f16_lost(b, 4.0) == 0.0
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "info" and f.action == {}  # no layer to change: fix the overflow
    assert f.data["held_down_by_overflows"] == 13
    assert f.data["allowed_scale"] == margin_scale(np.concatenate([a, b])) == 2.0**19
    assert "13 overflows" in f.title
    # the same layers at a scale nothing held down: keep them float32
    scales, skipped = keras_scale_history(30, lambda s, S: False, initial=4.0)
    run = scale_run([grad_probe(30, {"a": a, "b": b}, 4.0)], scales, skipped, initial=4.0)
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "warning" and f.action == {"float32_layers": ["a"]}


def test_a_layer_fed_rounded_ids_is_not_underflow():
    # keras.io's Transformer: float32 token ids cast to float16 by the embedding layer land on
    # other rows; the reference's rows are "zero in float16" there. That is id-rounding's finding.
    import numpy as np
    import pandas as pd

    scales, skipped = keras_scale_history(30, lambda s, S: False)
    emb = log_uniform(-20, -10, 5000, seed=7)
    rest = log_uniform(-20, -8, 10000, seed=8)
    probe = grad_probe(30, {"emb": emb, "block": rest}, scales[30])
    # what the mixed model got for 'emb': 70% of its reference-nonzero rows moved elsewhere
    moved = int(0.7 * 5000)
    probe["layers"][0] = probe_layer("emb", uf=moved / 5000)
    probe["layers"][0][1] = 5000
    probe["model"].update(underflow_fraction=moved / 15000, underflow_count=moved)
    run = scale_run([probe], scales, skipped)
    # without the inputs table: zeros where float16 holds the values (none of the reference's
    # lie below 2^-24 at this scale): said, as not underflow, with the layer they are in
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "info" and "not underflow" in f.title and f.data["layers"] == ["emb"]
    assert f.data["below_range_fraction"] == 0.0 and f.action == {}
    # a real-valued float input that the cast rounds is precision, not ids: still those zeros
    run.probe_inputs = pd.DataFrame(
        [[30, "x", "float32", 6400, False, 3.9, ["emb"], "float16", 6400]],
        columns=["step", *contract.PROBE_INPUT_COLUMNS],
    )
    assert findings_of(diagnose(run), RULE)[0].data["layers"] == ["emb"]
    run.probe_inputs = pd.DataFrame(
        [[30, "ids", "float32", 6400, True, 19990.0, ["emb"], "float16", 4679]],
        columns=["step", *contract.PROBE_INPUT_COLUMNS],
    )
    assert f16_lost(rest, scales[30]) == 0.0
    assert findings_of(diagnose(run), RULE) == []
    assert findings_of(diagnose(run), "loss-scale") == []
    # and the model-wide figure left is the other layers' own
    from mpwatch.judge.evidence import scale_facts as se

    (view,) = se.float16_probes(run)
    assert view.excluded == ["emb"] and view.measured == 0.0
    assert "emb" not in set(view.layers["layer"])
    assert np.isfinite(view.measured)


def test_a_layer_that_holds_layers_is_switched_whole_in_the_code():
    import pandas as pd

    probes = {10: (model_row(uf=0.0),
                   [probe_layer("conv2d", uf=0.3), probe_layer("dense", uf=0.06)])}  # fmt: skip
    run = make_run(probes=probes)
    lt = run.layers
    row = lt[lt["name"] == "conv2d"].iloc[0].to_dict()
    inner = {**row, "name": "conv_inner", "path": f"{row['path']}/conv_inner"}
    run.layers = pd.concat([lt, pd.DataFrame([inner])], ignore_index=True)
    (f,) = findings_of(diagnose(run), RULE)
    assert f.action == {"float32_layers": ["conv2d", "dense"]}
    code = [ln.split("#")[0].rstrip() for ln in f.fix.split("\n")]
    at = code.index('for sub in model.get_layer("conv2d")._flatten_layers():')
    assert code[at + 1] == '    sub.dtype_policy = "float32"'  # the container, all of it
    assert 'keras.layers.Dense(..., dtype="float32", name="dense")' in code  # a plain layer
    assert 'get_layer("dense")._flatten' not in f.fix  # a plain layer: dtype="float32" does it


def test_zeros_of_values_float16_holds_are_not_underflow_and_get_no_scale_advice():
    """An LSTM's gradients whose reference times the scale lies far above 2^-24 (saturated gates,
    cancellation: zero in float16 all the same) were called underflow, with a larger scale as
    the fix. Measured: 30% zero, none below float16's range at that scale (the probe's own
    histogram, checked here with numpy's float16): not underflow, and no scale helps."""
    scales, skipped = keras_scale_history(30, lambda s, S: False)
    g = log_uniform(-12, -4, 10000, seed=3)
    assert f16_lost(g, scales[30]) == 0.0  # numpy: float16 holds every g * S
    probe = grad_probe(30, {"lstm": g}, scales[30])
    probe["layers"][0] = probe_layer("lstm", uf=0.3)
    probe["layers"][0][1] = 10000
    probe["model"].update(underflow_fraction=0.3, underflow_count=3000)
    found = diagnose(scale_run([probe], scales, skipped))
    (f,) = findings_of(found, RULE)
    assert f.severity == "info" and f.title.endswith("not underflow")
    assert f.data["below_range_fraction"] == 0.0 and f.data["layers"] == ["lstm"]
    assert "initial_scale" not in f.fix and f.action == {}
    assert not [x for x in findings_of(found, "loss-scale") if "initial_scale" in x.fix]
