"""mpwatch on a machine without TensorFlow, as ``pip install "mpwatch[jax]"`` leaves it.

Each check runs in a process where every import of tensorflow fails as it does where TensorFlow
is not installed (``no_tensorflow/sitecustomize.py`` on PYTHONPATH); CI also installs
``.[jax]`` in a fresh virtual environment and runs the quick start there (``.ci/run``).

- A monitored fit on Keras' JAX backend records its loss scale, skipped steps and probes, and
  ``mpwatch diagnose`` and ``load_run`` read the run: the counts are checked against the
  optimizer's own state read in the same process.
- On Keras' TensorFlow backend the monitor's import says which extra installs TensorFlow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

FIT = textwrap.dedent(
    """
    import json, sys
    import keras, numpy as np
    import mpwatch

    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.random.default_rng(0).normal(size=(48, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True) * 1e4  # large targets: the first steps overflow and skip
    logdir = sys.argv[1]
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[mpwatch.MixedPrecisionMonitor(logdir, log_every=2, probe_every=3)])
    run = mpwatch.load_run(logdir, traces=False)
    opt = model.optimizer
    print(json.dumps({
        "tensorflow_imported": any(m.split(".")[0] == "tensorflow" for m in sys.modules),
        "scale": float(opt.dynamic_scale.numpy()),
        "iterations": int(opt.iterations.numpy()),
        "recorded_scale": float(run.scalar("mpwatch/loss_scale").iloc[-1]),
        "recorded_skipped": int(run.skipped_steps().sum()),
        "probes": int(len(run.probe_model)),
    }))
    """
)


def _env(backend: str) -> dict[str, str]:
    folders = (HERE / "no_tensorflow", ROOT, ROOT / "tensorboard_plugin")
    path = os.pathsep.join(str(folder) for folder in folders)
    return dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=path, MPWATCH_BUDGET="off")


def test_tensorflow_is_absent_in_these_processes():
    proc = subprocess.run([sys.executable, "-c", "import tensorflow"], env=_env("jax"),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "No module named 'tensorflow'" in proc.stderr


def test_a_jax_fit_is_recorded_and_diagnosed_without_tensorflow(tmp_path):
    pytest.importorskip("jax")
    logdir = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", FIT, logdir], env=_env("jax"),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["tensorflow_imported"]
    steps = 6
    assert got["recorded_scale"] == got["scale"]
    assert got["recorded_skipped"] == steps - got["iterations"] > 0  # the optimizer's own count
    assert got["probes"] == 2
    diag = subprocess.run([sys.executable, "-m", "mpwatch", "diagnose", logdir, "--format", "json"],
                          env=_env("jax"), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert diag.returncode == 0, diag.stderr[-3000:]
    report = json.loads(diag.stdout)
    assert report["runs"] and report["runs"][0]["steps"]["last"] == steps


def test_the_tensorflow_backend_without_tensorflow_names_the_extra():
    code = "import mpwatch; mpwatch.MixedPrecisionMonitor"
    proc = subprocess.run([sys.executable, "-c", code], env=_env("tensorflow"),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0
    assert 'pip install "mpwatch[tensorflow]"' in proc.stderr, proc.stderr[-2000:]
