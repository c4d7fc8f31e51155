"""Shared fixtures. TensorFlow is slow to import and models are slow to train on 2 cores: train once
per session and share the logdirs.

Fixtures for everyone:

- ``read_events``: ``read_events(logdir) -> (scalars, records)`` parses a logdir's event files
  without importing mpwatch: ``scalars[tag] = [(step, value), ...]`` in file order,
  ``records[kind] = [(step, payload_dict), ...]``.
- ``quickstart_logdir``: the logdir of a real short ``mixed_float16`` fit of the quick start CNN
  (float16 softmax output; ``examples/quickstart.py``), trained once per session.
- ``policy``: ``with policy("mixed_float16"): ...`` sets Keras' global policy and restores float32.
- ``jax_runs``: ``(out_dir, truth)`` of ``tests/jax/jax_fit.py`` run once per session in its own
  process with ``KERAS_BACKEND=jax`` (its docstring lists the cases and their logdirs).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import zlib

import pytest
from repo_scripts import load_script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
# a raw trace read as it is is cached per user (mpwatch/read/traces.py): the tests use their own
os.environ.setdefault("MPWATCH_CACHE_DIR", tempfile.mkdtemp(prefix="mpwatch-test-cache-"))
# the tests' fits take seconds: under the default cost budget (mpwatch/record/runtime/budget.py)
# their probes and profiles would not fit, and the tests are about what those record. No budget
# here; tests/record/test_budget.py sets one on its monitors explicitly (an argument wins over this)
os.environ["MPWATCH_BUDGET"] = "off"
# a finding whose printed code and applied advice keep different layers float32 fails the test
os.environ["MPWATCH_STRICT_ADVICE"] = "1"


def _read_events(logdir):
    """Parse event files independently of mpwatch (TensorBoard's loader, zlib + JSON by hand)."""
    import numpy as np
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    scalars: dict[str, list] = {}
    records: dict[str, list] = {}
    files = sorted(
        glob.glob(os.path.join(str(logdir), "**", "events.out.tfevents.*"), recursive=True)
    )
    for path in files:
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                arr = tensor_util.make_ndarray(value.tensor)
                if value.tag.startswith("mpwatch/record/"):
                    kind = value.tag[len("mpwatch/record/") :]
                    blob = arr.item() if isinstance(arr, np.ndarray) else arr
                    payload = json.loads(zlib.decompress(blob).decode("utf-8"))
                    records.setdefault(kind, []).append((event.step, payload))
                elif arr.dtype != object:
                    scalars.setdefault(value.tag, []).append((event.step, float(arr)))
    return scalars, records


@pytest.fixture(scope="session")
def read_events():
    return _read_events


@contextlib.contextmanager
def _policy(name):
    import keras

    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def set_policy():
    """``set_policy(name)`` sets Keras' global policy for one test (restored after it); a plain
    call, where ``policy`` is a context manager (a bare ``policy(name)`` sets nothing)."""
    import keras

    old = keras.mixed_precision.global_policy()
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy(old)


@pytest.fixture(scope="session")
def policy():
    return _policy


def _jax_script(tmp_path_factory, script: str, backend: str = "jax", **env_extra: str):
    """Runs ``tests/jax/<script>`` OUT (or ``tests/<dir>/<script>`` for ``script`` "dir/x.py")
    under a Keras backend (default JAX) in its own process (Keras fixes its backend at import, XLA
    its host devices when JAX starts); (OUT, its truth.json)."""
    import subprocess
    import sys

    from repo_scripts import ROOT

    if backend == "jax":
        pytest.importorskip("jax")
    path = ROOT / "tests" / (script if "/" in script else f"jax/{script}")
    out = tmp_path_factory.mktemp(f"{path.stem}_{backend}")
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(ROOT), **env_extra)
    proc = subprocess.run(
        [sys.executable, str(path), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "truth.json") as f:
        truth = json.load(f)
    return out, truth


@pytest.fixture(scope="session")
def script_runs(tmp_path_factory):
    """``script_runs(script, backend="jax", **env)``: :func:`_jax_script` for a test module of
    any folder (``from conftest import`` finds the nearest conftest, not this one)."""
    return lambda script, backend="jax", **env: _jax_script(
        tmp_path_factory, script, backend, **env
    )


@pytest.fixture(scope="session")
def jax_runs(tmp_path_factory):
    """tests/jax/jax_fit.py's runs and truth (the JAX backend's cases)."""
    return _jax_script(tmp_path_factory, "jax_fit.py")


@pytest.fixture(scope="session", params=["tensorflow", "jax"])
def beyond_runs(request, tmp_path_factory):
    """tests/beyond/beyond_fit.py's runs and truth under each backend: keras.io's Transformer
    under pure bfloat16 (Adam, SGD) and mixed_bfloat16."""
    return _jax_script(tmp_path_factory, "beyond/beyond_fit.py", backend=request.param)


@pytest.fixture(scope="session")
def dist_runs(tmp_path_factory):
    """tests/jax/jax_distribution.py's runs and truth: one model on one device, under
    DataParallel and under ModelParallel, on 4 XLA host devices."""
    return _jax_script(
        tmp_path_factory, "jax_distribution.py",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
    )  # fmt: skip


@pytest.fixture(scope="session")
def quickstart_logdir(tmp_path_factory):
    """A logdir from a real short mixed_float16 fit of the quick start CNN (float16 softmax)."""
    module = load_script("examples/quickstart.py")
    logdir = tmp_path_factory.mktemp("quickstart") / "run"
    module.train(str(logdir), epochs=1, samples=512, batch_size=64, log_every=2)
    return str(logdir)


@pytest.fixture
def mixed16():
    """The global policy set to mixed_float16 for one test, restored after."""
    import keras

    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy(old)
