"""The monitor is invisible (issue 24, item 5): with mpwatch on, the user's History, metrics,
weights, optimizer state (loss scale included) and random streams are bit-identical to a plain
fit, with the probe running mid-epoch, on a two-output model compiled with ``loss_weights``.

The experiment is ``tests/invisible_fit.py`` (its docstring lists what is compared). On
TensorFlow it runs in this process; on JAX (Keras fixes its backend at import) in a subprocess
with ``KERAS_BACKEND=jax``, which reports the differing values.

The bug this guards against: the probe computes the loss with the model's own ``compute_loss``,
whose compiled loss updates one ``Mean`` tracker per output; on TensorFlow those updates landed in
the user's trackers, so ``History``'s ``reg_loss`` and ``cls_loss`` averaged the probe batch's
losses in (three per probe) while ``loss`` did not. On JAX the same trackers made the probe fail
during fit (Keras purges the metrics' variables while it keeps their values in its state), so no
probe of a multi-output model was ever recorded there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import invisible_fit as experiment  # noqa: E402

import mpwatch  # noqa: E402


@pytest.fixture(scope="module")
def plain():
    old = keras.mixed_precision.global_policy()
    try:
        yield experiment.fit([])
    finally:
        keras.mixed_precision.set_global_policy(old)


@pytest.fixture
def mixed_policy_restored():
    old = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(old)


def test_a_plain_fit_is_deterministic_and_its_losses_add_up(plain, mixed_policy_restored):
    """The ground truth itself: two plain fits agree bit for bit (else nothing below could be
    compared), and the loss is the loss_weights' sum of the per-output losses."""
    assert experiment.compare(plain, experiment.fit([])) == []
    h = {k.removeprefix("history/"): v for k, v in plain.items() if k.startswith("history/")}
    w = experiment.LOSS_WEIGHTS
    for prefix in ("", "val_"):
        weighted = w["reg"] * h[f"{prefix}reg_loss"] + w["cls"] * h[f"{prefix}cls_loss"]
        np.testing.assert_allclose(weighted, h[f"{prefix}loss"], rtol=1e-5)
    # every kind of state is in the comparison
    for part in (
        "seed_generator_state",
        "moving_mean",
        "dynamic_scale",
        "step_counter",
        "reg_loss/total",
        "cls_loss/count",
        "hidden_kernel_velocity",
    ):
        assert any(k.endswith(part) or f"/{part}" in k for k in plain), part
    assert {"rng/python", "rng/numpy", "rng/keras"} <= set(plain)


@pytest.mark.parametrize("monitor", ["monitor", "probe"])
def test_the_monitored_fit_equals_the_plain_fit(
    plain, monitor, tmp_path, read_events, mixed_policy_restored
):
    log_dir = str(tmp_path / monitor)
    if monitor == "monitor":
        cb = mpwatch.MixedPrecisionMonitor(
            log_dir, log_every=4, probe_every=experiment.PROBE_EVERY, profile=False
        )
    else:
        cb = mpwatch.ProbeMonitor(log_dir, every=experiment.PROBE_EVERY)
    watched = experiment.fit([cb])
    assert experiment.compare(plain, watched) == []
    # the probe really ran, mid-epoch (12 batches an epoch) and at each epoch's end, and it
    # measured the train step's network (its loss agrees with the train step's)
    _, records = read_events(log_dir)
    probes = records["probe"]
    assert [s for s, _ in probes] == [5, 10, 12, 15, 20, 24]
    why = [p["unreliable_reason"] for _, p in probes]
    assert all(p["reliable"] is True for _, p in probes), why


def test_a_probe_before_any_train_step_leaves_the_trackers_at_zero(mixed_policy_restored):
    """A probe that builds the compiled loss (a custom loop, before any train step) creates the
    per-output trackers inside its pass; they start from zero as Keras' own do."""
    from mpwatch.record.probe.probe import Probe

    x, y, _ = experiment.data()
    model = experiment.build()
    batch = (x[:8], {k: v[:8] for k, v in y.items()})
    for _ in range(2):  # the first call creates the trackers, the second finds them
        payload = Probe(model).run(batch)
        assert payload["reliable"] is True
        names = [v.path for v in model.metrics_variables]
        assert "compile_loss/reg_loss/total" in names
        assert all(float(np.asarray(v)) == 0.0 for v in model.metrics_variables), names


def test_the_monitored_fit_equals_the_plain_fit_on_jax(tmp_path, read_events):
    pytest.importorskip("jax")
    from repo_scripts import ROOT

    out = tmp_path / "invisible.json"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "invisible_fit.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["backend"] == "jax"
    for monitor in ("monitor", "probe"):
        assert result[monitor]["differ"] == [], monitor
        keys = result[monitor]["keys"]
        assert "history/reg_loss" in keys and any("dynamic_scale" in k for k in keys)
        assert any("seed_generator_state" in k for k in keys)
    # the probes ran (mid-epoch) and agreed with the train step there too
    _, records = read_events(str(tmp_path / "invisible_probe"))
    probes = records["probe"]
    assert [s for s, _ in probes] == [5, 10, 12, 15, 20, 24]
    assert all(p["reliable"] is True for _, p in probes)
