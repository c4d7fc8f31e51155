"""Updates lost to rounding, against the variables' values before and after the step.

keras.io's Transformer classifier trains under each backend in tests/beyond/beyond_fit.py, which
records the truth without mpwatch's code: at every 4th step, each variable's values before and
after the step and the step's gradients recomputed on the same batch and weights. The event files
are read with the independent parser (conftest ``read_events``).

The truth's gradients are recomputed, so an element whose gradient is float noise (the key bias of
attention: softmax cancels it exactly in real numbers) can be exactly 0 in one computation and not
in the other; the counts are compared within a few elements of each variable for that.
"""

from __future__ import annotations

import pytest

import mpwatch
from mpwatch import contract


def _records(read_events, out, case):
    scalars, records = read_events(str(out / case))
    cols = contract.UPDATE_COLUMNS
    got = {}
    for step, payload in records.get("updates", []):
        for row in payload["variables"]["data"]:
            r = dict(zip(cols, row))
            got[(str(step), r["variable"])] = r
    return scalars, got


@pytest.mark.parametrize("case", ["bfloat16", "sgd"])
def test_counts_equal_the_variables_before_and_after(beyond_runs, read_events, case):
    out, truth = beyond_runs
    scalars, got = _records(read_events, out, case)
    want = truth[case]["updates"]
    assert sorted({s for s, _ in got}) == sorted(want) == ["12", "4", "8"]
    sizes = {p: n for p, _, n in truth[case]["trainable"]}
    for step, rows in want.items():
        for var, (updates, unchanged) in rows.items():
            r = got[(step, var)]
            assert r["dtype"] == "bfloat16" and r["size"] == sizes[var]
            slack = 6 + 2e-3 * sizes[var]  # float-noise gradients (module docstring)
            assert abs(r["updates"] - updates) <= slack, (step, var, r, updates)
            assert abs(r["unchanged"] - unchanged) <= slack, (step, var, r, unchanged)
            if r["updates"]:
                assert r["lost_fraction"] == pytest.approx(r["unchanged"] / r["updates"])
    # model-wide: the scalar is the records' total, and the truth's within 0.05%
    for step, rows in want.items():
        u = sum(got[(step, v)]["updates"] for v in rows)
        c = sum(got[(step, v)]["unchanged"] for v in rows)
        assert dict(scalars[contract.UPDATES_LOST_FRACTION])[int(step)] == pytest.approx(
            c / u, rel=1e-6
        )
        tu, tc = (sum(x[i] for x in rows.values()) for i in (0, 1))
        assert c / u == pytest.approx(tc / tu, abs=5e-4)


def test_adam_in_bfloat16_moves_nothing_and_the_rule_says_why(beyond_runs):
    out, truth = beyond_runs
    # the truth: not one element of any variable changed at the measured steps
    assert all(c == u for rows in truth["bfloat16"]["updates"].values() for u, c in rows.values())
    findings = [f for f in mpwatch.diagnose(str(out / "bfloat16")) if f.rule == "lost-updates"]
    (f,) = findings
    assert f.severity == "warning"
    assert "beta_2=0.999, which is 1.0 in bfloat16" in f.evidence
    assert 'set_global_policy("mixed_bfloat16")' in f.fix
    # the structural train-step warning gives way to the measurement
    assert not [
        g for g in mpwatch.diagnose(str(out / "bfloat16"))
        if g.rule == "train-step" and (g.data or {}).get("cause") == "variables_16bit"
    ]  # fmt: skip


def test_partial_losses_name_the_stagnating_layers(beyond_runs):
    out, truth = beyond_runs
    rows = [r for rows in truth["sgd"]["updates"].values() for r in rows.values()]
    lost = sum(c for _, c in rows) / sum(u for u, _ in rows)
    assert 0.5 < lost < 1.0  # SGD at 0.01 in bfloat16: most, not all, updates are lost
    (f,) = [f for f in mpwatch.diagnose(str(out / "sgd")) if f.rule == "lost-updates"]
    assert f.severity == "warning" and "no weight moved" not in f.evidence
    assert f.data["lost_fraction"] == pytest.approx(lost, abs=5e-4)
    named = [layer for layer, share in f.data["layers"].items() if share >= 0.5]
    assert f.layer in named


def test_the_fix_float32_variables_keeps_the_updates(beyond_runs, read_events):
    out, truth = beyond_runs
    # mixed_bfloat16: float32 variables; the truth's own count finds (almost) nothing lost
    rows = [r for rows in truth["mixed"]["updates"].values() for r in rows.values()]
    assert sum(c for _, c in rows) / sum(u for u, _ in rows) < 1e-4
    assert all(dtype == "float32" for _, dtype, _ in truth["mixed"]["trainable"])
    scalars, got = _records(read_events, out, "mixed")
    assert got == {} and contract.UPDATES_LOST_FRACTION not in scalars
    assert not [f for f in mpwatch.diagnose(str(out / "mixed")) if f.rule == "lost-updates"]
