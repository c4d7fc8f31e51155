"""Rule ``id-rounding`` (mpwatch/judge/rules/id_rounding.py) on constructed Runs; the real
keras.io Transformer is in tests/realmodels. Ground truth of the ids a cast changes: numpy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from builders import findings_of, make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "id-rounding"


def _run(ids: np.ndarray, cast_to: str = "float16", integer: bool = True, reliable=True):
    run = make_run(probes={100: (model_row(), [probe_layer("tok_emb")])})
    run.probe_model["reliable"] = reliable
    changed = int(np.count_nonzero(ids.astype(np.float16).astype(np.float64) != ids))
    row = ["ids", "float32", ids.size, integer, float(np.abs(ids).max()), ["tok_emb"], cast_to,
           changed]  # fmt: skip
    run.probe_inputs = pd.DataFrame([[100, *row]], columns=["step", *contract.PROBE_INPUT_COLUMNS])
    return run, changed


def test_rounded_ids_are_one_error_at_the_layer_with_the_int32_input_fix():
    ids = np.arange(0, 20000, 7, dtype=np.float64)
    run, changed = _run(ids)
    assert changed > 0
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "error" and f.layer == "tok_emb"
    assert f"{changed:,} of {ids.size:,}" in f.evidence
    assert 'dtype="int32"' in f.fix
    assert f.data["changed"] == changed


def test_small_ids_are_exact_and_say_nothing():
    run, changed = _run(np.arange(0, 1000, dtype=np.float64))
    assert changed == 0
    assert findings_of(diagnose(run), RULE) == []


def test_ids_near_the_exact_limit_warn():
    run, changed = _run(np.arange(1500, 2048, dtype=np.float64))
    assert changed == 0
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "warning"


def test_float_features_and_unreliable_probes_are_not_judged():
    run, _ = _run(np.linspace(0, 5000, 100), integer=False)
    assert findings_of(diagnose(run), RULE) == []
    run, _ = _run(np.arange(0, 20000, 7, dtype=np.float64), reliable=False)
    assert findings_of(diagnose(run), RULE) == []
