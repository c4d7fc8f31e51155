"""The advisor's rules on constructed Runs (pure pandas, no TensorFlow, no event files)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from builders import (
    LAYER_COLUMNS,
    PROBE_LAYER_COLUMNS,
    layer_rows,
    profile_payload,
    run_info,
)

from mpwatch import contract
from mpwatch.judge import advisor
from mpwatch.judge.advisor import Finding, diagnose
from mpwatch.read.run import Run


def make_run(name="run", policy="mixed_float16", layers=None, scalars=None, probes=None,
             profile=None, info=None, notices=None) -> Run:  # fmt: skip
    run = Run(name=name, path=f"/logs/{name}")
    run.info = info if info is not None else run_info(policy)
    lt = pd.DataFrame(layers if layers is not None else layer_rows(policy), columns=LAYER_COLUMNS)
    run.layers = lt
    if scalars:
        steps = sorted({s for ser in scalars.values() for s in ser})
        df = pd.DataFrame(index=pd.Index(steps, dtype="int64", name="step"))
        for tag, ser in scalars.items():
            df[tag] = pd.Series(ser, dtype="float64")
        run.scalars = df
    if probes:
        rows, models = [], []
        for step, (model, layer_rows_) in probes.items():
            for r in layer_rows_:
                rows.append([step, *r])
            models.append({"step": step, **model})
        run.probe_layers = pd.DataFrame(rows, columns=["step", *PROBE_LAYER_COLUMNS])
        run.probe_model = pd.DataFrame(models)
        run.records[contract.KIND_PROBE] = [(s, {}) for s in probes]
    run.profile = profile
    run.notices = notices or []
    return run


def probe_layer(name, uf=0.0, rel=1e-4, mx=10.0, nonfinite=False):
    head = math.log2(65504 / mx) if mx and math.isfinite(mx) and mx > 0 else float("-inf")
    return [name, 1000, int(uf * 1000), uf, 1e-3, rel, mx, head, 0.0, nonfinite]


def model_row(uf=0.0, scale=32768.0, rec=32768.0, mode="float16", mx=10.0, first=None):
    return {"ref_nonzero": 1000, "underflow_count": int(uf * 1000), "underflow_fraction": uf,
            "grad_rel_error": 1e-3, "max_abs_activation": mx, "first_nonfinite_layer": first,
            "loss_scale": scale, "recommended_scale": rec, "mode": mode,
            "reference": "float32_twin"}  # fmt: skip


def rules(findings, rule):
    return [f for f in findings if f.rule == rule]


HEALTHY_LAYERS = [
    r[:7] + ["float32", "float32"] + r[9:] if r[0] == "predictions" else r
    for r in layer_rows("mixed_float16")
]
# predictions: compute float32, output float32; conv2d filters aligned
HEALTHY_LAYERS[3][5] = "float32"
HEALTHY_LAYERS[3][4] = "float32"
HEALTHY_LAYERS[0][11] = {"filters": 32, "input_channels": 3}
HEALTHY_LAYERS[0][12] = False  # input channels 3: not the user's to change


def healthy_run(**kw):
    info = run_info("mixed_float16", batch_size=64)
    steps = range(1, 1001)
    scalars = {
        contract.LOSS_SCALE: {s: 32768.0 for s in steps},
        contract.STEP_SKIPPED: {s: 0.0 for s in steps},
    }
    probes = {500: (model_row(0.001), [probe_layer("conv2d"), probe_layer("dense")])}
    return make_run(layers=HEALTHY_LAYERS, info=info, scalars=scalars, probes=probes, **kw)


def test_healthy_run_has_only_info():
    findings = diagnose(healthy_run())
    assert [f.rule for f in findings if f.severity != "info"] == []
    assert {f.rule for f in findings} <= {"float32-inside"}


def test_output_float16_is_an_error_with_the_fix():
    run = make_run()
    (f,) = rules(diagnose(run), "output-16bit")
    assert f.severity == "error" and f.layer == "predictions"
    assert 'dtype="float32"' in f.fix and f.action == {"dtype": "float32", "output": True}
    assert "float16" in f.title and f.why and f.source


def test_output_uses_last_layer_without_is_output_and_bfloat16_is_a_warning():
    rows = layer_rows("mixed_bfloat16")
    for r in rows:
        r[13] = False
    (f,) = rules(diagnose(make_run(policy="mixed_bfloat16", layers=rows)), "output-16bit")
    assert f.layer == "predictions" and f.severity == "warning"


def test_float32_output_after_float16_compute_is_fine():
    rows = layer_rows("mixed_float16", output_dtype="float32")
    assert rules(diagnose(make_run(layers=rows)), "output-16bit") == []


@pytest.mark.parametrize(
    ("mx", "nonfinite", "severity"),
    [(65504 * 2, False, "error"), (float("inf"), True, "error"), (65504 / 4, False, "warning"),
     (65504 / 16, False, None)],
)  # fmt: skip
def test_activation_overflow_thresholds(mx, nonfinite, severity):
    probes = {10: (model_row(mx=mx), [probe_layer("dense", mx=mx, nonfinite=nonfinite)])}
    found = rules(diagnose(make_run(probes=probes)), "activation-overflow")
    if severity is None:
        assert found == []
    else:
        (f,) = found
        assert f.severity == severity and f.layer == "dense"
        assert f.data["max_abs_activation"] in (None, mx) or math.isinf(mx)


def test_first_nonfinite_layer_named():
    probes = {10: (model_row(first="dense"), [probe_layer("dense", mx=float("inf"))])}
    (f,) = rules(diagnose(make_run(probes=probes)), "activation-overflow")
    assert f.severity == "error" and f.layer == "dense" and "first" in f.title.lower()


def test_bfloat16_probe_is_not_checked_against_65504():
    probes = {10: (model_row(mode="bfloat16", mx=1e6), [probe_layer("dense", mx=1e6)])}
    assert rules(diagnose(make_run(probes=probes)), "activation-overflow") == []


@pytest.mark.parametrize(("uf", "severity"), [(0.005, None), (0.02, "warning"), (0.2, "error")])
def test_gradient_underflow_model_thresholds(uf, severity):
    probes = {10: (model_row(uf=uf, scale=8.0, rec=2.0**15), [probe_layer("dense", uf=0.0)])}
    found = [f for f in rules(diagnose(make_run(probes=probes)), "gradient-underflow")
             if f.layer is None]  # fmt: skip
    if severity is None:
        assert found == []
    else:
        (f,) = found
        assert f.severity == severity
        assert "initial_scale=32768" in f.fix and f.action == {"loss_scale": 32768.0}
        assert f.data["underflow_fraction"] == uf


def test_gradient_underflow_per_layer():
    probes = {10: (model_row(uf=0.0), [probe_layer("dense", uf=0.06), probe_layer("c", uf=0.04)])}
    found = rules(diagnose(make_run(probes=probes)), "gradient-underflow")
    assert [f.layer for f in found] == ["dense"]


def test_subnormal_share_without_probe_is_info():
    steps = range(1, 41)
    run = make_run(scalars={contract.GRAD_SUBNORMAL_FRACTION: {s: 0.2 for s in steps}})
    (f,) = rules(diagnose(run), "gradient-underflow")
    assert f.severity == "info"


def test_loss_scale_stuck_low():
    steps = range(1, 401)
    run = make_run(scalars={contract.LOSS_SCALE: {s: (1.0 if s > 50 else 1024.0) for s in steps}})
    (f,) = rules(diagnose(run), "loss-scale")
    assert f.severity == "error" and f.data["median_scale"] == 1.0


def test_loss_scale_far_below_recommended():
    steps = range(1, 401)
    probes = {400: (model_row(uf=0.05, scale=2.0**8, rec=2.0**14), [probe_layer("dense")])}
    run = make_run(scalars={contract.LOSS_SCALE: {s: 2.0**8 for s in steps}}, probes=probes)
    (f,) = rules(diagnose(run), "loss-scale")
    assert f.severity == "warning" and f.data["log2_ratio"] == -6
    assert "5.00%" in f.evidence
    # far below, but float16 loses nothing at the scale used: the dynamic scale will grow, info
    probes = {400: (model_row(uf=0.0, scale=2.0**8, rec=2.0**14), [probe_layer("dense")])}
    run = make_run(scalars={contract.LOSS_SCALE: {s: 2.0**8 for s in steps}}, probes=probes)
    (f,) = rules(diagnose(run), "loss-scale")
    assert f.severity == "info"
    # 3 doublings: below the threshold of 4
    probes = {400: (model_row(scale=2.0**8, rec=2.0**11), [probe_layer("dense")])}
    run = make_run(scalars={contract.LOSS_SCALE: {s: 2.0**8 for s in steps}}, probes=probes)
    assert rules(diagnose(run), "loss-scale") == []


@pytest.mark.parametrize(("every", "severity"), [(200, None), (50, "warning"), (5, "error")])
def test_skipped_step_rate(every, severity):
    steps = range(1, 1101)
    # 10 skips in the warm-up never count
    sk = {s: 1.0 if (s <= 10 or s % every == 0) else 0.0 for s in steps}
    found = rules(diagnose(make_run(scalars={contract.STEP_SKIPPED: sk})), "skipped-steps")
    if severity is None:
        assert found == []
    else:
        (f,) = found
        n = sum(1 for s in steps if s > 100 and s % every == 0)
        assert f.severity == severity and f.data["skipped"] == n and f.data["steps"] == 1000


def test_skipped_steps_from_totals_when_no_per_step_flag():
    tot = {s: float(10 + (s - 100) // 10) if s > 100 else 10.0 for s in range(10, 1101, 10)}
    (f,) = rules(diagnose(make_run(scalars={contract.SKIPPED_STEPS_TOTAL: tot})), "skipped-steps")
    assert f.data["skipped"] == 100 and f.data["steps"] == 1000


def test_output_rel_error_and_layers_float32_inside_never_cast():
    layers = [probe_layer("dense", rel=0.02), probe_layer("layer_norm", rel=0.9),
              probe_layer("conv2d", rel=0.001)]  # fmt: skip
    run = make_run(probes={10: (model_row(), layers)})
    found = diagnose(run)
    assert [f.layer for f in rules(found, "output-rel-error")] == ["dense"]
    (info,) = rules(found, "float32-inside")
    assert info.severity == "info" and info.data["layers"] == ["layer_norm"]
    # never a float32 action for a layer that already computes in float32 inside
    assert not [f for f in found if f.layer == "layer_norm" and f.action.get("dtype")]


def test_output_rel_error_bfloat16_threshold():
    layers = [probe_layer("dense", rel=0.03)]
    run = make_run(policy="mixed_bfloat16", probes={10: (model_row(mode="bfloat16"), layers)})
    assert rules(diagnose(run), "output-rel-error") == []


def test_tensor_core_alignment():
    run = make_run()  # conv2d filters 30, batch 30, output Dense(10) (classes: not flagged)
    found = rules(diagnose(run), "tensor-core-alignment")
    assert [(f.layer, f.severity) for f in found] == [("conv2d", "warning"), (None, "warning")]
    assert "filters=32" in found[0].fix and "batch_size=32" in found[1].fix
    # no Tensor Cores: info; float32 policy: nothing
    run = make_run(info=run_info("mixed_float16", tc=False))
    assert {f.severity for f in rules(diagnose(run), "tensor-core-alignment")} == {"info"}
    assert rules(diagnose(make_run(policy="float32")), "tensor-core-alignment") == []


def test_try_mixed_precision_with_preflight_numbers():
    layers = [probe_layer("dense", mx=30000.0), probe_layer("conv2d", mx=10.0)]
    probes = {5: (model_row(uf=0.03, mode="preflight", mx=30000.0), layers)}
    run = make_run(policy="float32", probes=probes)
    (f,) = rules(diagnose(run), "try-mixed-precision")
    assert f.action == {"policy": "mixed_bfloat16"}  # compute capability 8.0
    assert "3.00%" in f.evidence and f.data["keep_float32"] == ["dense"]
    cpu = make_run(policy="float32", info=run_info("float32", tc=False))
    assert rules(diagnose(cpu), "try-mixed-precision") == []
    v100 = run_info("float32")
    v100["device"]["compute_capability"] = "7.0"
    (f,) = rules(diagnose(make_run(policy="float32", info=v100)), "try-mixed-precision")
    assert f.action == {"policy": "mixed_float16"}


def _perf(step_ms, loss_factor, mem):
    steps = range(10, 201, 10)
    return {contract.STEP_TIME_MS: {s: step_ms for s in steps},
            contract.PEAK_MEMORY_MB: {s: mem for s in steps},
            contract.TRAIN_LOSS: {s: loss_factor / s for s in steps}}  # fmt: skip


def test_mixed_vs_float32_comparison():
    mixed = make_run("mixed", scalars=_perf(10.0, 1.0, 400.0))
    f32 = make_run("fp32", policy="float32", scalars=_perf(25.0, 1.02, 800.0))
    (f,) = rules(advisor.diagnose_runs([mixed, f32]), "mixed-vs-float32")
    assert f.severity == "info" and f.run == "mixed"
    assert f.data["step_time_ratio"] == pytest.approx(0.4)
    assert f.data["memory_ratio"] == pytest.approx(0.5)
    assert f.data["losses_agree"] is True
    slow = make_run("mixed", scalars=_perf(30.0, 2.0, 400.0))
    (f,) = rules(advisor.diagnose_runs([slow, f32]), "mixed-vs-float32")
    assert f.severity == "warning" and "no speed-up" in f.title and "losses differ" in f.title
    # a different model is not compared
    other = make_run("fp32", policy="float32", scalars=_perf(25.0, 1.0, 800.0),
                     info={**run_info("float32"), "model": {"name": "x", "params": 1}})  # fmt: skip
    assert rules(advisor.diagnose_runs([mixed, other]), "mixed-vs-float32") == []


def test_profile_findings():
    prof = profile_payload()
    layers = layer_rows("mixed_float16")
    layers[1][4:6] = ["float32", "float32"]  # dense under a float32 policy
    prof["layers"]["data"][1][3] = 3000.0  # 30% of the time in float32
    found = rules(diagnose(make_run(layers=layers, profile=prof)), "profile")
    titles = [f.title for f in found]
    assert any("Cast" in t for t in titles)
    assert any("16 bits" in t for t in titles)
    assert [f.layer for f in found if f.layer] == ["dense"]  # conv2d is mixed already
    ok = dict(prof, cast_share=0.05, share_16bit=0.9)
    ok["layers"] = {"columns": prof["layers"]["columns"], "data": []}
    assert rules(diagnose(make_run(profile=ok)), "profile") == []


def test_notices_become_findings():
    run = make_run(notices=[{"step": 3, "part": "probe", "level": "error", "message": "boom"}])
    (f,) = rules(diagnose(run), "recording")
    assert f.severity == "warning" and "boom" in f.title


def test_every_rule_is_documented_and_findings_serialize():
    for r in advisor.RULES.values():
        assert r.why and r.threshold and r.source
    inf = float("inf")
    probes = {10: (model_row(uf=0.5, mx=inf), [probe_layer("dense", mx=inf)])}
    findings = diagnose(make_run(probes=probes))
    for f in findings:
        assert f.rule in advisor.RULES
        d = f.to_dict()
        assert d["severity"] in advisor.SEVERITIES
        import json

        json.dumps(d, allow_nan=False)
    order = [advisor.SEVERITIES.index(f.severity) for f in findings]
    assert order == sorted(order, reverse=True)
    with pytest.raises(ValueError):
        Finding("x", "fatal", "t", "e")


def test_advisor_imports_no_tensorflow():
    code = "import sys, mpwatch.judge.advisor; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_empty_run_has_no_findings():
    assert diagnose(Run(name=".", path="/x")) == []
    assert np.isnan(np.nan)  # keep numpy import used


def test_nested_model_output_names_the_inner_layer():
    rows = layer_rows("mixed_float16")
    rows.append(["inner", "inner", "Functional", 0, "mixed_float16", "float16", "float32",
                 "float16", "float16", 650, 650, {}, None, True, None])  # fmt: skip
    found = rules(diagnose(make_run(layers=rows)), "output-16bit")
    assert [f.layer for f in found] == ["predictions"]


@pytest.mark.parametrize(("early", "severity"), [(10, None), (12, "warning"), (16, "error")])
def test_skips_within_warm_up_beyond_the_scales_descent(early, severity):
    steps = range(1, 301)
    sk = {s: 1.0 if s <= early else 0.0 for s in steps}
    found = rules(diagnose(make_run(scalars={contract.STEP_SKIPPED: sk})), "skipped-steps")
    if severity is None:
        assert found == []
    else:
        (f,) = found
        assert f.severity == severity and f.data["early"] == early
