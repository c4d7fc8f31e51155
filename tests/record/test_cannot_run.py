"""A part that cannot run, or fails, never prints a traceback into the user's fit (issue 49).

It says so once, in one line that names the fix (``loss_fn=`` for a model compiled without a loss,
``probe_data=`` for a distributed fit), as a notice the diagnosis shows too; the traceback goes to
the "mpwatch" logger at DEBUG only; the fit completes with a plain fit's weights. What a user's
console shows is read from a process of its own (tests/scripts/cannot_run.py: no logging set up,
two logical CPU devices for MirroredStrategy); the rest in this process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from repo_scripts import ROOT  # noqa: E402

import mpwatch  # noqa: E402
from mpwatch.record.callbacks.probe_monitor import ProbeMonitor  # noqa: E402

FIX = {"distiller": "loss_fn=", "mirrored": "probe_data="}



# --- as a user sees it ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """(OUT, truth, {case: the lines the monitored fit printed}) of tests/scripts/cannot_run.py."""
    out = tmp_path_factory.mktemp("cannot_run")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "cannot_run.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed, case = {}, None
    for line in proc.stderr.splitlines():
        if line.startswith("=== "):
            case = None if line == "=== end" else line[4:]
            printed.setdefault(case, [])
        elif case is not None:
            printed[case].append(line)
    with open(out / "truth.json") as f:
        return out, json.load(f), printed


@pytest.mark.parametrize("case", ["distiller", "mirrored"])
def test_the_fit_prints_one_line_with_the_fix_and_no_traceback(console, case):
    out, truth, printed = console
    lines = printed[case]
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    (line,) = [ln for ln in lines if FIX[case] in ln]  # exactly one line names the fix
    assert line.startswith("mpwatch: probe cannot run (training goes on): ")
    assert [ln for ln in lines if ln.startswith("mpwatch")] == [line]  # and nothing else of ours
    # the fit completed, and trained as a plain fit
    assert truth[case]["epochs"] == 2
    assert truth[case]["same_weights"] and truth[case]["same_history"]


@pytest.mark.parametrize("case", ["distiller", "mirrored"])
def test_the_traceback_is_in_the_debug_log_only(console, case):
    _, truth, _ = console
    records = truth[case]["records"]
    assert all(not r["tb"] for r in records if r["level"] != "DEBUG")
    (debug,) = [r for r in records if r["tb"]]
    assert debug["level"] == "DEBUG" and FIX[case] in debug["message"]
    assert debug["tb"].startswith("Traceback") and "CannotRun" in debug["tb"]


@pytest.mark.parametrize("case", ["distiller", "mirrored"])
def test_the_diagnosis_shows_the_notice_with_the_fix(console, case):
    out, _, printed = console
    said = [ln for ln in printed[case] if FIX[case] in ln][0]
    findings = [
        f for f in mpwatch.diagnose(mpwatch.load_run(str(out / case))) if f.rule == "recording"
    ]
    (finding,) = [f for f in findings if f.data["part"] == "probe"]
    assert finding.severity == "warning"
    assert FIX[case] in finding.title  # the fix is in the title, not cut off
    assert said.endswith(finding.title.removeprefix("Recording part 'probe': "))
    cli = subprocess.run(
        [sys.executable, "-m", "mpwatch", "diagnose", str(out / case)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert sum(FIX[case] in ln for ln in cli.stdout.splitlines()) == 1, cli.stdout


# --- in this process -----------------------------------------------------------------------------
class _Distill(keras.Model):
    """keras.io's knowledge distillation, compiled with its own arguments and no loss."""

    def __init__(self, student, teacher):
        super().__init__()
        self.student, self.teacher = student, teacher

    def compile(self, optimizer, student_loss_fn, distillation_loss_fn, temperature=3):
        super().compile(optimizer=optimizer, metrics=[keras.metrics.SparseCategoricalAccuracy()])
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.temperature = temperature

    def distill(self, x, y, y_pred):
        from keras import ops

        t = self.temperature
        soft = self.distillation_loss_fn(
            ops.softmax(self.teacher(x, training=False) / t, axis=1),
            ops.softmax(y_pred / t, axis=1),
        )
        return 0.1 * self.student_loss_fn(y, y_pred) + 0.9 * soft

    def call(self, x):
        return self.student(x)


class Distiller(_Distill):
    """keras.io's TensorFlow version: its train_step computes the loss, so Keras' own
    ``compute_loss`` has none (the probe neither)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self.student(x, training=True)
            scaled = self.optimizer.scale_loss(self.distill(x, y, y_pred))
        variables = self.student.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        return self.compute_metrics(x, y, y_pred)


class Distiller3(_Distill):
    """keras.io's Keras 3 version: Keras' own train_step, a ``compute_loss`` of its own."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
        return self.distill(x, y, y_pred)


def _distiller(cls):
    def tiny():
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])

    keras.utils.set_random_seed(2)
    model = cls(tiny(), tiny())
    model.compile(
        keras.optimizers.SGD(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        keras.losses.KLDivergence(),
    )
    return model


X = np.random.default_rng(0).random((12, 6), dtype=np.float32)
Y = np.arange(12) % 3


def test_said_once_a_run_across_fits(set_policy, tmp_path, caplog, read_events):
    set_policy("mixed_float16")
    model = _distiller(Distiller)
    mon = mpwatch.MixedPrecisionMonitor(str(tmp_path), probe_every=1)
    with caplog.at_level(logging.DEBUG, logger="mpwatch"):
        for _ in range(2):
            model.fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[mon])
    said = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "loss_fn=" in r.getMessage()
    ]
    assert len(said) == 1 and said[0].exc_info is None and "\n" not in said[0].getMessage()
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG and r.exc_info]
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)
    _, records = read_events(tmp_path)
    (notice,) = [p for _, p in records["notice"] if p["part"] == "probe"]
    assert "loss_fn=" in notice["message"] and "Distiller" in notice["message"]
    assert "probe" not in records


def test_a_model_that_computes_its_own_loss_is_probed(set_policy, tmp_path, read_events):
    """keras.io's Keras 3 Distiller (``compute_loss`` overridden, no compiled loss): the probe has
    the model's loss, and runs."""
    set_policy("mixed_float16")
    model = _distiller(Distiller3)
    mon = ProbeMonitor(str(tmp_path), every=1)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0, callbacks=[mon])
    _, records = read_events(tmp_path)
    assert [s for s, _ in records["probe"]] == [1, 2, 3]
    assert not [p for _, p in records.get("notice", []) if p["part"] == "probe"]


def test_a_failing_part_says_one_line_and_keeps_its_traceback_for_debug(
    set_policy, tmp_path, caplog
):
    set_policy("mixed_float16")
    dump = "\n".join(f"  'layer_{i}': {{'units': {i}}}," for i in range(200))  # a config dump

    def broken(y_true, y_pred):
        raise RuntimeError(f"boom\n{dump}")

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    y = np.eye(3, dtype=np.float32)[Y]
    mon = ProbeMonitor(str(tmp_path), every=1, probe_data=(X, y), loss_fn=broken)
    with caplog.at_level(logging.DEBUG, logger="mpwatch"):
        model.fit(X, y, batch_size=4, epochs=1, verbose=0, callbacks=[mon])
    (error,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    text = error.getMessage()
    assert error.levelno == logging.ERROR and error.exc_info is None
    assert "\n" not in text and "RuntimeError: boom" in text and len(text) < 500
    (debug,) = [r for r in caplog.records if r.exc_info]
    assert debug.levelno == logging.DEBUG and debug.exc_info[0] is RuntimeError


def test_a_probe_part_that_fails_is_said_once_in_one_line(
    set_policy, tmp_path, caplog, monkeypatch
):
    """Float8 readiness failing at every probe (a Keras-style multi-line message): one warning
    line for the run, the traceback at DEBUG, and each probe's record still written."""
    from mpwatch.record.probe import float8_capture

    def fails(*args, **kwargs):
        raise ValueError("Exception encountered when calling Dense.call().\n\nsome detail\n" * 20)

    monkeypatch.setattr(float8_capture, "readiness", fails)
    set_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.Dense(1, dtype="float32")])  # fmt: skip
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    mon = ProbeMonitor(tmp_path, every=1)
    mon.float8 = True
    with caplog.at_level(logging.DEBUG, logger="mpwatch"):
        model.fit(x, x[:, :1], batch_size=4, verbose=0, callbacks=[mon])
    warned = [r for r in caplog.records
              if r.levelno == logging.WARNING and "float8" in r.getMessage()]  # fmt: skip
    assert len(warned) == 1 and "\n" not in warned[0].getMessage()
    assert warned[0].exc_info is None and len(warned[0].getMessage()) < 400
    assert [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(mpwatch.load_run(str(tmp_path)).probe_model) >= 4  # every probe still recorded
