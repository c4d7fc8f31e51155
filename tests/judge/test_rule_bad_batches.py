"""Rule ``bad-batches`` (mpwatch/judge/rules/bad_batches.py) and the attribution of every skipped
step to its cause (mpwatch/judge/evidence/skip_causes.py), on constructed Runs.

Ground truth: the batches are numpy arrays with known bad records; the loss scale and skip flags
follow Keras' dynamic rule step by step (``keras_scale_history``), overflowing on the bad batches,
on a doubling past what the gradients allow, and on a few sound batches.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import assert_findings, findings_of, keras_scale_history, make_run

from mpwatch import contract
from mpwatch.judge import diagnose
from mpwatch.judge.evidence.skip_causes import skip_causes

# three halvings after the descent (400, 900, 1500) take four doublings, 2000 finite steps each,
# to climb back past 2^12: the one at 11500 fails
STEPS = 11600
BAD = {400: 1e30, 900: np.nan}  # step -> the bad value one record of its batch holds
SOUND_OVERFLOWS = {1500}  # a sound batch that overflows at a scale that had worked
LIMIT = 2.0**12  # the gradients fit at scales up to 2^12


def _batches():
    rng = np.random.default_rng(0)
    out = {}
    for s in range(1, STEPS + 1):
        x = rng.normal(size=(32, 8)).astype("float32")
        if s in BAD:
            x[3, 1] = BAD[s]
        out[s] = x
    return out


def _overflows(step, scale):
    return step in BAD or step in SOUND_OVERFLOWS or scale > LIMIT


def _run():
    batches = _batches()
    scales, skipped = keras_scale_history(STEPS, _overflows)
    finite = {s: np.isfinite(x) for s, x in batches.items()}
    peak = {s: float(np.abs(np.where(finite[s], x, 0)).max()) for s, x in batches.items()}
    bad = {s: float((~finite[s]).sum()) for s in batches}
    return make_run(scalars={contract.LOSS_SCALE: scales, contract.STEP_SKIPPED: skipped,
                             contract.INPUT_MAX_ABS: peak,
                             contract.INPUT_NONFINITE_COUNT: bad})  # fmt: skip


def _truth():
    """Each skipped step's cause, from Keras' rule and the batches themselves."""
    scales, skipped = keras_scale_history(STEPS, _overflows)
    out, descending = {}, True
    for s in range(1, STEPS + 1):
        if not skipped[s]:
            descending = False
            continue
        ran_at = scales[s - 1]
        if descending:
            out[s] = "descent"
        elif s in BAD:
            out[s] = "bad_input"
        elif ran_at > LIMIT:
            out[s] = "growth"
        else:
            out[s] = "unexplained"
    return out


def test_every_skip_is_attributed_to_its_cause():
    got = {c.step: c.cause for c in skip_causes(_run())}
    truth = _truth()
    assert got == truth
    # 2^15 down to 2^12 is three halvings; a doubling after 2000 finite steps fails once
    assert [s for s, c in truth.items() if c == "descent"] == [1, 2, 3]
    assert sorted(s for s, c in truth.items() if c == "bad_input") == sorted(BAD)
    assert list(truth.values()).count("growth") >= 1
    assert [s for s, c in truth.items() if c == "unexplained"] == sorted(SOUND_OVERFLOWS)


def test_bad_batches_named_by_step_with_their_values():
    (f,) = findings_of(diagnose(_run()), "bad-batches")
    assert f.severity == "error"
    assert f.data["steps"] == sorted(BAD)
    assert f.data["skipped_steps"] == sorted(BAD)
    assert f.data["nonfinite_steps"] == [900]
    assert "1.00e+30" in f.evidence and "step 400" in f.evidence and "step 900" in f.evidence
    assert "filter" in f.fix and "dtype" not in f.fix  # the data, never a layer dtype


def test_the_skipped_steps_finding_counts_the_descent_and_points_at_what_exists():
    run = _run()
    found = diagnose(run)
    rules = {f.rule for f in found}
    for f in findings_of(found, "skipped-steps"):
        # every finding it names exists; the descent is counted, not a constant
        for named in ("bad-batches", "activation-overflow", "loss-scale"):
            if f"({named})" in f.evidence:
                assert named in rules
        assert "3 in the scale's descent from 2^15 (32768) to 2^12 (4096)" in f.evidence
        assert f.data["by_cause"]["unexplained"] == sorted(SOUND_OVERFLOWS)


def test_a_clean_run_has_no_bad_batch():
    run = _run()
    run.scalars[contract.INPUT_MAX_ABS] = run.scalars[contract.INPUT_MAX_ABS].clip(upper=4.0)
    run.scalars[contract.INPUT_NONFINITE_COUNT] = 0.0
    assert findings_of(diagnose(run), "bad-batches") == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("mixed_float16", [{"severity": "warning", "data": {"steps": [7]}}]),
        ("mixed_bfloat16", []),  # 7e4 is in bfloat16's range
    ],
)
def test_values_beyond_float16_matter_only_under_float16(policy, expected):
    peak = {s: 1.0 for s in range(1, 21)}
    peak[7] = 7e4
    run = make_run(policy=policy, scalars={contract.INPUT_MAX_ABS: peak,
                                           contract.INPUT_NONFINITE_COUNT: {7: 0.0}})  # fmt: skip
    assert_findings(findings_of(diagnose(run), "bad-batches"), expected)


def test_skips_a_probe_saw_coming_are_the_model_overflow_of_the_layer_it_names():
    """The model's own pass overflows on every 23rd batch whatever the scale (Keras' rule step by
    step); the probes at steps 600 and 2990 saw their pass go non-finite at the scale then in use,
    first in 'predictions'. Those skips are that layer's consequence: no skipped-steps finding of
    their own, but evidence in the finding about 'predictions'."""
    from builders import model_row, probe_layer

    def over(step, scale):
        return scale > 2.0**12 or step % 23 == 0

    scales, skipped = keras_scale_history(3000, over)
    probes = {p: (model_row(scale=scales[p - 1], first="predictions"),
                  [probe_layer("predictions", nonfinite=True)]) for p in (600, 2990)}  # fmt: skip
    run = make_run(scalars={contract.LOSS_SCALE: scales, contract.STEP_SKIPPED: skipped},
                   probes=probes)  # fmt: skip
    got = {c.step: c.cause for c in skip_causes(run)}
    # truth from the rule itself: the probe at 2990 saw the pass non-finite at the lowest scale
    # the run reached, so every skip ran at a scale the model overflows at (none is a descent
    # to a normal level: a probe's own non-finite pass outranks it)
    ran_at = {s: scales[s - 1] for s in range(1, 3001) if skipped[s]}
    assert all(v >= scales[2989] for v in ran_at.values())
    assert got == {s: "model_overflow" for s in ran_at}
    alone = make_run(scalars={contract.LOSS_SCALE: scales, contract.STEP_SKIPPED: skipped})
    assert findings_of(diagnose(alone), "skipped-steps")  # without the probe: a finding of its own
    found = diagnose(run)
    assert findings_of(found, "skipped-steps") == []
    (head,) = [f for f in found if f.layer == "predictions" and f.severity == "error"]
    assert "skipped-steps" in head.data["also"]


# --- the features' own scale beyond float16's range (a tabular model's raw areas and prices) ----
def _scaled_features_run(first="Normalization", dtype="float16", every=True, graph=True):
    """40 batches of raw features (numpy: a column of prices up to 3e5), ``every`` batch or one in
    ten past float16's range; the model's first layer ``first`` computes in ``dtype``."""
    from builders import graph_row

    rng = np.random.default_rng(1)
    peak = {}
    for s in range(1, 41):
        x = np.stack([rng.uniform(0, 1, 64), rng.uniform(1e4, 3e5 if every or s % 10 == 0
                                                          else 6e4, 64)], 1)  # fmt: skip
        peak[s] = float(np.abs(x).max())
    rows = [graph_row("norm", first, inputs=["input_layer"], params=0, dtype=dtype),
            graph_row("dense", inputs=["norm"], act="relu", width=8, dims={"units": 8}),
            graph_row("out", inputs=["dense"], width=1, dims={"units": 1}, out=True,
                      dtype="float32")]  # fmt: skip
    run = make_run(layers=rows, scalars={contract.INPUT_MAX_ABS: peak,
                                         contract.INPUT_NONFINITE_COUNT: {1: 0.0}})  # fmt: skip
    if not graph:
        run.layers = run.layers.drop(columns=contract.LAYERS_GRAPH_COLUMNS)
    return run, peak


def test_every_batch_beyond_float16_is_the_features_scale_and_names_the_layer_taking_it():
    run, peak = _scaled_features_run()
    (f,) = findings_of(diagnose(run), "bad-batches")
    beyond = sorted(s for s, v in peak.items() if v > 65504)
    assert len(beyond) == 40 and f.severity == "error" and f.layer == "norm"
    assert f.data == {"cause": "input_scale", "steps": beyond, "layers": ["norm"]}
    assert "not bad records" in f.evidence and "'norm' (Normalization)" in f.evidence
    assert 'keras.layers.Normalization(..., dtype="float32", name="norm")' in f.fix
    assert "before adapt" in f.fix and "filter" not in f.fix  # no record is dropped
    assert f.action == {"dtype": "float32"}


def test_the_features_scale_into_a_float16_dense_asks_for_a_float32_normalization_first():
    run, _ = _scaled_features_run(first="Dense")
    (f,) = findings_of(diagnose(run), "bad-batches")
    assert f.layer == "norm" and f.action == {}  # a Dense in float32 is no normalization
    assert 'norm = keras.layers.Normalization(dtype="float32")' in f.fix


def test_values_beyond_float16_that_reach_only_float32_layers_are_no_finding():
    """The fix applied (the Normalization that takes the raw features in float32): float16
    never sees them, and no step skipped on them is theirs."""
    run, _ = _scaled_features_run(dtype="float32")
    assert findings_of(diagnose(run), "bad-batches") == []


def test_a_few_batches_beyond_float16_are_still_bad_batches():
    run, peak = _scaled_features_run(every=False)
    (f,) = findings_of(diagnose(run), "bad-batches")
    assert f.data["steps"] == sorted(s for s, v in peak.items() if v > 65504) == [10, 20, 30, 40]
    assert f.data["cause"] == "input" and "filter" in f.fix


def test_without_the_graph_every_batch_beyond_float16_is_still_the_features_scale():
    run, _ = _scaled_features_run(graph=False)
    (f,) = findings_of(diagnose(run), "bad-batches")
    assert f.data["cause"] == "input_scale" and f.layer is None and f.data["layers"] == []
    assert "norm.adapt(x_train)" in f.fix
