"""Rules ``lost-updates`` and ``float8-readiness`` (mpwatch/judge/rules/) on constructed Runs;
the real keras.io Transformer, under both backends, is in tests/beyond. Ground truth: counts made
here (the lost share of each layer is its unchanged elements over its updates, summed over steps).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from builders import findings_of, make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.judge import diagnose
from mpwatch.judge.rules.lost_updates import rounds_to_one


def _updates_run(rows, policy="bfloat16", optimizer="Adam"):
    """rows: (step, variable, layer, updates, unchanged)."""
    run = make_run(policy=policy)
    data = [[s, v, layer, "bfloat16", 100, u, c, c / u if u else math.nan]
            for s, v, layer, u, c in rows]  # fmt: skip
    run.updates = pd.DataFrame(data, columns=["step", *contract.UPDATE_COLUMNS])
    run.train_step = {"optimizers": [{"class": optimizer, "stepped": True}]}
    return run


@pytest.mark.parametrize(
    "rows, severity, layers",
    [
        # one layer loses 60% (warning, named); the other 1%
        ([(10, "a/gamma", "m/a", 100, 60), (10, "b/kernel", "m/b", 1000, 10)], "warning", ["m/a"]),
        # no layer at 50%, model-wide 10%: info
        ([(10, "a/gamma", "m/a", 100, 30), (10, "b/kernel", "m/b", 900, 70)], "info", []),
        # 2% model-wide: nothing
        ([(10, "a/gamma", "m/a", 100, 2), (10, "b/kernel", "m/b", 900, 18)], None, []),
        # summed over steps: 40 + 70 of 200 = 55%
        ([(10, "a/gamma", "m/a", 100, 40), (20, "a/gamma", "m/a", 100, 70)], "warning", ["m/a"]),
    ],
)
def test_layers_are_named_by_their_summed_share(rows, severity, layers):
    found = findings_of(diagnose(_updates_run(rows)), "lost-updates")
    if severity is None:
        assert found == []
        return
    (f,) = found
    assert f.severity == severity
    lost = {}
    for _, _, layer, u, c in rows:
        lost.setdefault(layer, [0, 0])
        lost[layer][0] += u
        lost[layer][1] += c
    assert f.data["layers"] == pytest.approx({k: c / u for k, (u, c) in lost.items()})
    assert [n for n, s in f.data["layers"].items() if s >= 0.5] == layers
    assert 'set_global_policy("mixed_bfloat16")' in f.fix


def test_nothing_moved_under_adam_in_bfloat16_says_beta_2():
    rows = [(10, "a/kernel", "m/a", 100, 100), (10, "b/kernel", "m/b", 50, 50)]
    (f,) = findings_of(diagnose(_updates_run(rows)), "lost-updates")
    assert "beta_2=0.999, which is 1.0 in bfloat16" in f.evidence
    (g,) = findings_of(diagnose(_updates_run(rows, optimizer="SGD")), "lost-updates")
    assert "beta_2" not in g.evidence and "no weight moved at all" in g.evidence


def test_a_layer_of_its_own_in_16_bits_under_a_mixed_policy_gets_its_own_fix():
    rows = [(10, "a/kernel", "m/a", 100, 90)]
    (f,) = findings_of(diagnose(_updates_run(rows, policy="mixed_bfloat16")), "lost-updates")
    assert "set_global_policy" not in f.fix and 'm/a: build it with dtype="mixed_bfloat16"' in f.fix


def test_rounding_to_one_is_the_formats_spacing():
    import ml_dtypes
    import numpy as np

    for x in (0.999, 0.998, 0.99, 0.9995, 0.9999):
        assert rounds_to_one(x, "bfloat16") == (float(np.array(x, ml_dtypes.bfloat16)) == 1.0)
        assert rounds_to_one(x, "float16") == (float(np.float16(x)) == 1.0)


def _float8_run(rows, device=None):
    run = make_run(probes={8: (model_row(mode="bfloat16"), [probe_layer("d")])})
    run.probe_model["reliable"] = True
    run.probe_float8 = pd.DataFrame(
        [[8, *r] for r in rows], columns=["step", *contract.PROBE_FLOAT8_COLUMNS]
    )
    if device is not None:
        run.info["device"] = device
    return run


def _f8(name, ready, reason=None):
    return [f"m/{name}", "Dense", name, 0.003, 0.04, 0.003, 0.06, 0.003, 0.05, 0.0, 0.0, 0.0, ready,
            reason]  # fmt: skip


def test_float8_lists_ready_layers_with_filtered_quantize_code():
    run = _float8_run([_f8("q", True), _f8("k", True), _f8("out", False, "output error 30%")])
    (f,) = findings_of(diagnose(run), "float8-readiness")
    assert f.title == "float8: 2 of 3 Dense/EinsumDense layers are ready to convert"
    assert "not ready: out (output error 30%)" in f.evidence
    assert "keep = {'out'}" in f.fix and "layer.name not in keep" in f.fix
    run = _float8_run([_f8("q", True), _f8("k", False, "a"), _f8("out", False, "b")])
    (f,) = findings_of(diagnose(run), "float8-readiness")
    assert "ready = {'q'}" in f.fix and "layer.name in ready" in f.fix
    assert "compute capability 8.9" in f.evidence  # the builders' device has no float8


def test_float8_on_an_h100_says_it_runs_there_and_none_ready_has_no_code():
    h100 = {"type": "GPU", "name": "H100", "compute_capability": 9.0, "tensor_cores": True}
    (f,) = findings_of(diagnose(_float8_run([_f8("out", False, "x")], h100)), "float8-readiness")
    assert "compute capability 9.0) runs float8" in f.evidence
    assert f.fix.startswith("# nothing to convert")


def test_float8_on_a_gpu_as_recorded_with_capability_as_text_and_the_jax_caveat():
    """The recorder keeps the compute capability as text ("9.0", mpwatch.record.runtime.backend):
    an H200 run said float8 needs 8.9 or more. On Keras' JAX backend the finding says what an
    H200 measured: XLA drops quantize's float8 roundings unless told not to, and ran no float8
    matmul (benchmarks/float8_real.py)."""
    h200 = {"type": "GPU", "name": "NVIDIA H200", "compute_capability": "9.0",
            "tensor_cores": True}  # fmt: skip
    run = _float8_run([_f8("q", True), _f8("out", False, "x")], h200)
    (f,) = findings_of(diagnose(run), "float8-readiness")
    assert "compute capability 9.0) runs float8" in f.evidence
    assert "xla_allow_excess_precision" not in f.evidence  # TensorFlow: no JAX caveat
    run = _float8_run([_f8("q", True), _f8("out", False, "x")], h200)
    run.info["backend"] = "jax"
    (f,) = findings_of(diagnose(run), "float8-readiness")
    assert "--xla_allow_excess_precision=false" in f.evidence
    assert "ran no float8 matmul" in f.evidence


def test_float8_table_absent_says_nothing():
    assert findings_of(diagnose(make_run()), "float8-readiness") == []


def test_float8_repeated_names_are_filtered_by_keras_path():
    rows = [_f8("q", True), _f8("k", True), _f8("out", False, "x")]
    rows[1][0], rows[1][2] = "m/b2/q", "b2/q"  # a second block's "q"
    rows[0][2] = "b1/q"
    (f,) = findings_of(diagnose(_float8_run(rows)), "float8-readiness")
    assert "keep = {'out'}" in f.fix and "layer.path not in keep" in f.fix
