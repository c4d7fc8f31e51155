"""Rule ``output-rel-error`` (mpwatch/judge/rules/output_rel_error.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import (
    assert_findings,
    findings_of,
    graph_row,
    layer_rows,
    make_run,
    model_row,
    probe_layer,
)

from mpwatch import contract
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


# --- a layer compared with its real inputs (the layer table's graph; issue 24) -------------------
def _graph_run(rows, errs, old=False):
    """Layers ``(name, class, inputs)`` in forward order (a name the table lacks, e.g. 'x', is a
    model input), a float32 output 'probs' fed by the last one, and the probe's output errors
    ``errs`` (a layer missing there has no measured output); ``old``: no graph columns."""
    table = [graph_row(n, cls, inputs=ins, width=8) for n, cls, ins in rows]
    table.append(graph_row("probs", inputs=[rows[-1][0]], dtype="float32", out=True, width=8))
    run = make_run(layers=table, probes={
        10: (model_row(), [probe_layer(n, rel=errs[n]) for n, _, _ in rows if n in errs])
    })  # fmt: skip
    if old:
        run.layers = run.layers.drop(columns=contract.LAYERS_GRAPH_COLUMNS)
    return run


# EfficientNet's squeeze-excite block: the expanded branch carries 3% (made by 'expand'); the
# gate (pool -> reduce -> gate, a sigmoid near 0.5) has a small error; 'se_mul' multiplies them
SE = [
    ("expand", "Conv2D", ["x"]),
    ("pool", "GlobalAveragePooling2D", ["expand"]),
    ("reduce", "Conv2D", ["pool"]),
    ("gate", "Conv2D", ["reduce"]),
    ("se_mul", "Multiply", ["expand", "gate"]),
    ("project", "Conv2D", ["se_mul"]),
]
SE_ERRS = {"expand": 0.03, "pool": 0.004, "reduce": 0.003, "gate": 0.001, "se_mul": 0.031,
           "project": 0.004}  # fmt: skip

CASES += [
    pytest.param(
        _graph_run(SE, SE_ERRS),
        [
            {
                "layer": "expand",
                "data": {"downstream": ["se_mul"], "inputs": ["x"], "input_error": 0.0},
                "evidence_has": ("its inputs ('x') bring none", "carries on into 'se_mul'"),
            }
        ],
        id="squeeze-excite-multiply-inherits-its-branchs-error",
    ),  # fmt: skip
    pytest.param(
        _graph_run(SE, SE_ERRS, old=True),
        [
            {"layer": "expand", "data": {"inputs": None}},
            {"layer": "se_mul", "evidence_has": "the layer before it: 0.001"},
        ],
        id="without-the-graph-the-layer-before-it-as-before",
    ),  # fmt: skip
    pytest.param(
        _graph_run(SE, {**SE_ERRS, "se_mul": 0.2}),
        [
            {"layer": "expand", "data": {"downstream": []}},
            {
                "layer": "se_mul",
                "data": {"input_error": 0.03, "inputs": ["expand", "gate"]},
                "evidence_has": "its inputs bring at most 0.03 ('expand')",
            },
        ],
        id="a-merge-that-grows-its-inputs-error-is-a-cause",
    ),  # fmt: skip
    pytest.param(
        # 'drop' has no measured output: it brings what its input 'a' brings
        _graph_run(
            [("a", "Dense", ["x"]), ("drop", "Dropout", ["a"]), ("b", "Dense", ["drop"])],
            {"a": 0.05, "b": 0.06},
        ),
        [{"layer": "a", "data": {"downstream": ["b"]}}],
        id="an-unmeasured-layer-passes-its-inputs-error-on",
    ),  # fmt: skip
    pytest.param(
        # a branch: 'side' reads the model input, so 'a's 5% is not what it starts from
        _graph_run([("a", "Dense", ["x"]), ("side", "Dense", ["x"])], {"a": 0.05, "side": 0.04}),
        [{"layer": "a"}, {"layer": "side", "data": {"input_error": 0.0}}],
        id="a-branch-off-the-input-is-compared-with-the-input-not-the-row-before",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_output_rel_error(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def _se_fit(logdir):
    """A real fit with the probe: 'branch' cancels two inputs near 1.0 (x0 - x1, times 1000), so
    float16's rounding of the inputs gives it a ~5% error; 'gate' is a sigmoid off the same
    input; 'se_mul' multiplies them (the squeeze-excite shape). Learning rate 0: the weights stay
    as set."""
    import keras
    import numpy as np

    import mpwatch

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((16,), name="x")
        a = keras.layers.Dense(16, name="branch")(x)
        g = keras.layers.Dense(16, activation="sigmoid", name="gate")(x)
        m = keras.layers.Multiply(name="se_mul")([a, g])
        model = keras.Model(x, keras.layers.Dense(1, dtype="float32", name="out")(m))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    w = np.zeros((16, 16), "float32")
    w[0], w[1] = 1000.0, -1000.0
    model.get_layer("branch").set_weights([w, np.zeros(16, "float32")])
    rng = np.random.default_rng(0)
    data = rng.uniform(0, 1, (64, 16)).astype("float32")
    data[:, 0], data[:, 1] = 1.0 + rng.uniform(0, 0.01, 64), 1.0
    model.compile(keras.optimizers.SGD(0.0), "mse")
    monitor = mpwatch.MixedPrecisionMonitor(str(logdir), probe_every=2)
    model.fit(data, rng.normal(size=(64, 1)), batch_size=16, verbose=0, callbacks=[monitor])
    return model, data, mpwatch.load_run(str(logdir))


def test_a_real_squeeze_excite_multiply_is_not_blamed_and_the_fix_works(tmp_path):
    """The probe measures 'se_mul' as far off as 'branch' (it multiplies branch's error by a
    gate); only 'branch' is the cause. Ground truth with numpy (float64): keeping 'branch' in
    float32 (the finding's fix, applied by apply_recommendations) removes se_mul's error; keeping
    'se_mul' in float32 (what the row-before comparison advised) does not."""
    import keras
    import numpy as np

    from mpwatch import apply_recommendations

    model, data, run = _se_fit(tmp_path)
    errs = run.latest_probe().layers.set_index("layer")["output_rel_error"]
    assert errs["se_mul"] > 0.01 and errs["se_mul"] > 2 * errs["gate"]  # the old rule's blame
    (f,) = findings_of(diagnose(run), RULE)
    assert f.layer == "branch" and "se_mul" in f.data["downstream"]
    old = run.layers.drop(columns=contract.LAYERS_GRAPH_COLUMNS)
    run.layers = old  # a record without the graph: the row before it, as before
    assert [g.layer for g in findings_of(diagnose(run), RULE)] == ["branch", "se_mul"]

    wb, bb = (np.asarray(v, np.float64) for v in model.get_layer("branch").get_weights())
    wg, bg = (np.asarray(v, np.float64) for v in model.get_layer("gate").get_weights())
    d = data.astype(np.float64)
    truth = (d @ wb + bb) * (1 / (1 + np.exp(-(d @ wg + bg))))

    def se_error(findings):
        fixed = apply_recommendations(model, findings).model
        tap = keras.Model(fixed.inputs, fixed.get_layer("se_mul").output)
        got = np.asarray(tap([data]), np.float64)
        return np.linalg.norm(got - truth) / np.linalg.norm(truth)

    assert se_error([]) > 0.01
    assert se_error([f]) < 1e-3  # the cause kept in float32: the error is gone
    blamed = findings_of(diagnose(run), RULE)[1]
    assert blamed.layer == "se_mul" and se_error([blamed]) > 0.01  # the old advice changes nothing


def _op_run(skips=True):
    """dense far off float32 (its RMS square overflowed inside it, said by the probe's op
    scan), and five steps skipped after the first 100."""
    layers = [probe_layer("d0", rel=0.0003), probe_layer("dense", rel=1.0)]
    scalars = {}
    if skips:  # skips after the start, each halving the scale: no descent of Keras'
        hit, scale, scales = (120, 150, 180, 210, 240), 2.0**15, {0: 2.0**15}
        for s in range(1, 301):
            scale = scale / 2 if s in hit else scale
            scales[s] = scale
        scalars = {contract.STEP_SKIPPED: {s: float(s in hit) for s in range(1, 301)},
                   contract.LOSS_SCALE: scales}  # fmt: skip
    run = make_run(probes={10: (model_row(), layers)}, scalars=scalars)
    run.records[contract.KIND_PROBE] = [(10, {"op_overflows": [
        {"layer": "dense", "op": "Square", "source": "model.py:12", "dtype": "float16",
         "input_max_abs": 1497.0, "layer_output_finite": True}]})]  # fmt: skip
    return run


def test_an_op_overflowing_inside_the_layer_is_named_and_an_error():
    found = diagnose(_op_run())
    (f,) = findings_of(found, RULE)
    assert f.severity == "error" and f.layer == "dense"
    assert "Square overflows float16" in f.title
    assert "Square (model.py:12) is the first op" in f.evidence
    assert "(its input reaches 1497)" in f.evidence
    assert "makes the layer's output finite again" in f.evidence
    assert f.action == {"dtype": "float32"}
    # what follows from it is its evidence: no skipped-steps finding of its own
    assert findings_of(found, "skipped-steps") == []


def test_without_an_op_scan_the_same_error_stays_a_warning():
    run = _op_run()
    run.records[contract.KIND_PROBE] = [(10, {})]
    found = diagnose(run)
    (f,) = findings_of(found, RULE)
    assert f.severity == "warning" and "op" not in f.title.split(":")[0]
    assert findings_of(found, "skipped-steps")  # the skips, a finding of their own here
