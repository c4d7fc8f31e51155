"""Rule ``no-tensor-cores`` (mpwatch/judge/rules/no_tensor_cores.py): a 16-bit policy on a device
without fast 16-bit math, from the device facts; replaced by the measured comparison when a float32
run of the same model is in the logdir."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, perf_scalars, run_info

from mpwatch.judge import diagnose, diagnose_runs

RULE = "no-tensor-cores"


def _on(policy, kind="GPU", cc=None, name=None):
    info = run_info(policy)
    info["device"] = {
        "type": kind,
        "name": name or ("cpu" if kind == "CPU" else "a GPU"),
        "compute_capability": cc,
        "tensor_cores": bool(cc and float(cc) >= 7.0),
    }
    return make_run(name="mixed" if policy != "float32" else "fp32", policy=policy, info=info)


def _no_device():
    info = run_info("mixed_float16")
    del info["device"]
    return make_run(info=info)


CASES = [
    pytest.param(
        _on("mixed_float16", "CPU"),
        [
            {
                "severity": "warning",
                "title_has": "on a CPU: likely slower than float32",
                "action": {"policy": "float32"},
                "fix_has": 'set_global_policy("float32")',
            }
        ],
        id="mixed-float16-on-a-cpu",
    ),  # fmt: skip
    pytest.param(
        _on("mixed_float16", cc="6.1", name="Tesla P100"),
        [{"severity": "warning", "title_has": "compute capability 6.1"}],
        id="mixed-float16-on-a-pascal-gpu",
    ),
    pytest.param(_on("mixed_float16", cc="7.0"), [], id="mixed-float16-on-a-v100"),
    pytest.param(_on("mixed_bfloat16", cc="7.5"), [{"severity": "warning"}], id="bf16-on-turing"),
    pytest.param(_on("mixed_bfloat16", cc="8.0"), [], id="bfloat16-on-an-a100"),
    pytest.param(
        _on("mixed_bfloat16", "CPU"),
        [{"severity": "info", "title_has": "may be slower"}],
        id="bfloat16-on-a-cpu-is-info",
    ),
    pytest.param(_on("mixed_float16", cc=None), [], id="gpu-without-capability-unknown"),
    pytest.param(_no_device(), [], id="no-device-facts"),
    pytest.param(_on("float32", "CPU"), [], id="float32-nothing"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_no_tensor_cores(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_a_measured_comparison_replaces_the_device_guess():
    """Issue 17: on a CPU mixed_float16 was 3.8x slower than float32 for ResNet50; with the float32
    run in the logdir the finding is the measurement (and names the device), not the guess."""
    mixed = _on("mixed_float16", "CPU")
    fp32 = _on("float32", "CPU")
    mixed.scalars = make_run(scalars=perf_scalars(38.0, 1.0, 400.0)).scalars
    fp32.scalars = make_run(scalars=perf_scalars(10.0, 1.0, 800.0)).scalars
    found = diagnose_runs([mixed, fp32])
    assert findings_of(found, RULE) == []
    (f,) = findings_of(found, "mixed-vs-float32")
    assert f.severity == "warning" and f.run == "mixed"
    assert "3.8x slower" in f.title and "on a CPU" in f.title
    assert f.data["step_time_ratio"] == pytest.approx(3.8)
    assert f.action == {"policy": "float32"} and 'set_global_policy("float32")' in f.fix


def test_no_advice_to_move_layers_to_16_bits_on_a_cpu():
    """Issue 17: on a CPU, mpwatch advised moving more layers to 16 bits."""
    from builders import layer_rows, profile_payload

    prof = profile_payload()  # 16-bit share 30%: on a GPU, a warning to move more to 16 bits
    layers = layer_rows("mixed_float16")
    layers[1][4:6] = ["float32", "float32"]
    prof["layers"]["data"][1][3] = 3000.0  # 'dense' (float32) takes 30% of the time
    run = _on("mixed_float16", "CPU")
    run.layers = make_run(layers=layers).layers
    run.profile = prof
    found = diagnose(run)
    assert not [f for f in found if "16 bits" in f.title or "mixed_float16" in f.fix
                and f.rule != RULE]  # fmt: skip
    assert not [f for f in found if f.rule in ("try-mixed-precision",)]
    assert [f.rule for f in found if f.rule == "profile"] == ["profile"]  # the Cast share only
