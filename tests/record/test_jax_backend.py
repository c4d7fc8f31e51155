"""mpwatch on Keras' JAX backend: the same records as on TensorFlow, checked against the
optimizer's own state.

Keras fixes its backend at import, so the training runs in a subprocess with
``KERAS_BACKEND=jax`` (tests/jax/jax_fit.py, which also records the truth: the optimizer's
``dynamic_scale`` and ``iterations`` after every Keras call, read by an independent callback after
``model.jax_state_sync()``). This process parses the event files with the independent parser
(conftest ``read_events``) and reads them with ``mpwatch.load_run`` / ``mpwatch.diagnose``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from repo_scripts import ROOT

from mpwatch import contract

pytest.importorskip("jax")

BATCHES = 24
OVERFLOW_BATCHES = {2, 3, 9, 17}  # as in tests/jax/jax_fit.py (0-based)


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax")
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "jax" / "jax_fit.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "truth.json") as f:
        truth = json.load(f)
    return out, truth


def _per_batch_truth(truth):
    """Per batch (spe 1): the scale after it, and whether its update was skipped."""
    t = truth["forced_spe1_every1"]
    its = [0] + t["iterations"]
    skipped = [float(its[i + 1] == its[i]) for i in range(BATCHES)]
    return t["scale"], skipped


@pytest.mark.parametrize("spe, log_every", [(1, 1), (1, 7), (4, 1), (4, 7)])
def test_loss_scale_and_skips_equal_the_optimizers(jax_runs, read_events, spe, log_every):
    out, truth = jax_runs
    scale, skipped = _per_batch_truth(truth)
    # the forced overflows, and nothing else, were skipped
    assert [i for i, s in enumerate(skipped) if s] == sorted(OVERFLOW_BATCHES)
    case = truth[f"forced_spe{spe}_every{log_every}"]
    if spe > 1:  # the per-call truth is every spe-th value of the per-batch one
        assert case["scale"] == scale[spe - 1 :: spe]
    scalars, records = read_events(str(out / f"forced_spe{spe}_every{log_every}"))
    got_scale = scalars[contract.LOSS_SCALE]
    assert got_scale[0] == (0, 32768.0)  # the scale before the first step
    assert got_scale[1:] == [(i + 1, s) for i, s in enumerate(scale)]
    assert scalars[contract.STEP_SKIPPED] == [(i + 1, s) for i, s in enumerate(skipped)]
    total = dict(scalars[contract.SKIPPED_STEPS_TOTAL])
    assert total[max(total)] == len(OVERFLOW_BATCHES)
    (info,) = [p for _, p in records["run_info"]]
    assert info["backend"] == "jax" and info["steps_per_execution"] == spe
    assert info["versions"]["jax"] and info["policy"] == "mixed_float16"


def test_gradient_health_every_log_every_steps(jax_runs, read_events):
    out, _ = jax_runs
    scalars, records = read_events(str(out / "forced_spe1_every7"))
    steps = [s for s, _ in scalars[contract.GRAD_NONFINITE_COUNT]]
    assert steps == [7, 14, 21]
    (rows_at_7,) = [p["variables"]["data"] for s, p in records["grad_variables"] if s == 7]
    sizes = [r[contract.GRAD_VARIABLE_COLUMNS.index("size")] for r in rows_at_7]
    assert sizes == [16 * 32, 32, 32, 1]  # kernel and bias of both Dense layers
    nonfinite = dict(scalars[contract.GRAD_NONFINITE_COUNT])
    assert nonfinite[7] == 0  # batch 7 (index 6) is finite


def test_the_diagnosis_names_the_float16_softmax(jax_runs, read_events):
    import mpwatch

    out, truth = jax_runs
    logdir = str(out / "softmax")
    _, records = read_events(logdir)
    (layers,) = [p for _, p in records["layers"]][-1:]
    table = {r[0]: r for r in layers["layers"]["data"]}
    assert "probs" in table
    run = mpwatch.load_run(logdir)
    assert run.warnings == []
    row = run.layers.set_index("name").loc["probs"]
    assert row["compute_dtype"] == "float16"
    findings = mpwatch.diagnose(logdir)
    out16 = [f for f in findings if f.rule == "output-16bit"]
    assert len(out16) == 1 and "probs" in out16[0].title
    # the probe is TensorFlow-only for now: said once, as a notice, never as a crash
    probe_notices = [n for n in run.notices if n["part"] == "probe"]
    assert len(probe_notices) == 1 and "TensorFlow backend only" in probe_notices[0]["message"]
    assert not [n for n in run.notices if n["level"] == "error" and n["part"] != "profile"]
    assert np.isfinite(run.scalar(contract.TRAIN_LOSS)).all()


def test_an_unsupported_backend_is_refused_before_training(monkeypatch, tmp_path):
    """Keras' torch (or numpy) backend: a clear error at on_train_begin, nothing written."""
    import keras

    import mpwatch
    from mpwatch.record import backend

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    monitor = mpwatch.MixedPrecisionMonitor(str(tmp_path / "run"))
    monitor.set_model(model)
    monkeypatch.setattr(backend, "name", lambda: "torch")
    with pytest.raises(backend.UnsupportedBackendError, match="'torch' backend is not supported"):
        monitor.on_train_begin()
    assert not list((tmp_path / "run").glob("events.*"))
